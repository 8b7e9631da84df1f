# cmake/strata_family.cmake: the one way a kernel family is built and tested.
#
#   strata_kernel_family(NAME <name>
#                        PARAMS <header under src/, e.g. cpu/mlr_params.h>
#                        BODIES <kernel bodies under src/, e.g. cpu/kernels/mlr.inc> ...
#                        SOURCES <entry points, references, ...: .cpp files of strata_core>
#                        TESTS <test .cpp files>)
#
# compiles the bodies once per ISA of STRATA_ISAS (a generated unit per ISA: cmake/isa_unit.cpp.in,
# inside namespace strata::cpu::<isa>, with that ISA's flags below), adds them and SOURCES to
# strata_core, and builds the tests into one GoogleTest executable strata_<name>_tests (label
# core). Adding a family: a params header, a kernel body that defines its kernel table, a
# reference, and one call of this function (docs/architecture.md). STRATA_BUILD_TESTS=OFF (the
# Python package's build) leaves the tests out.

# The ISAs and their flags: the only list (Isa in include/strata/cpu.h and STRATA_PER_ISA in
# src/core/dispatch.h name the same three). GCC 12 warns falsely inside its own avx512fintrin.h
# reduce helpers: -Wno-maybe-uninitialized.
set(STRATA_ISAS scalar avx2 avx512)
set(STRATA_ISA_LEVEL_scalar 0)
set(STRATA_ISA_LEVEL_avx2 1)
set(STRATA_ISA_LEVEL_avx512 2)
set(STRATA_ISA_FLAGS_scalar "")
set(STRATA_ISA_FLAGS_avx2 -mavx2 -mfma -ffp-contract=fast)
set(STRATA_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -ffp-contract=fast
    -Wno-maybe-uninitialized)

function(strata_kernel_family)
  cmake_parse_arguments(F "" "NAME;PARAMS" "BODIES;SOURCES;TESTS" ${ARGN})
  set(FAMILY_NAME ${F_NAME})
  set(FAMILY_PARAMS ${F_PARAMS})
  set(FAMILY_BODY_INCLUDES "")
  foreach(body ${F_BODIES})
    string(APPEND FAMILY_BODY_INCLUDES "#include \"${body}\"\n")
  endforeach()
  foreach(ISA ${STRATA_ISAS})
    set(ISA_LEVEL ${STRATA_ISA_LEVEL_${ISA}})
    set(unit ${PROJECT_BINARY_DIR}/isa_units/${F_NAME}_${ISA}.cpp)
    configure_file(${PROJECT_SOURCE_DIR}/cmake/isa_unit.cpp.in ${unit} @ONLY)
    set_source_files_properties(${unit} PROPERTIES COMPILE_OPTIONS "${STRATA_ISA_FLAGS_${ISA}}")
    target_sources(strata_core PRIVATE ${unit})
  endforeach()
  target_sources(strata_core PRIVATE ${F_SOURCES})
  if(F_TESTS AND STRATA_BUILD_TESTS)
    add_executable(strata_${F_NAME}_tests ${F_TESTS})
    target_include_directories(strata_${F_NAME}_tests PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests/cpp)
    target_compile_options(strata_${F_NAME}_tests PRIVATE ${STRATA_WARNINGS})
    target_link_libraries(strata_${F_NAME}_tests PRIVATE strata_core GTest::gtest GTest::gtest_main)
    # Under the sanitizers the kernels' workspace is also poisoned with NaN on every call
    # (src/core/rows.inc): a read of scratch not written in the same call fails the sweep there.
    set(poison "")
    if(STRATA_SANITIZE)
      set(poison ENVIRONMENT STRATA_POISON_WORKSPACE=1)
    endif()
    gtest_discover_tests(strata_${F_NAME}_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS core ${poison})
  endif()
endfunction()
