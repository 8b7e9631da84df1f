# cmake/strata_mlr.cmake: MLR attention (issue 3): the CPU kernel (one translation unit per ISA),
# its references, the decode cache, and the strata_mlr_tests executable. Included by the top-level CMakeLists.txt.
target_sources(strata_core PRIVATE
  src/cpu/mlr.cpp
  src/cpu/mlr_avx512.cpp
  src/cpu/mlr_avx2.cpp
  src/cpu/mlr_scalar.cpp
  src/cpu/reference/mlr_reference.cpp
  src/cpu/kv_cache.cpp
)
# Same per-ISA flags as attention_{avx512,avx2}.cpp in the top-level file.
set_source_files_properties(src/cpu/mlr_avx512.cpp PROPERTIES COMPILE_OPTIONS
  "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-ffp-contract=fast;-Wno-maybe-uninitialized")
set_source_files_properties(src/cpu/mlr_avx2.cpp PROPERTIES COMPILE_OPTIONS
  "-mavx2;-mfma;-ffp-contract=fast")

add_executable(strata_mlr_tests tests/cpp/core_mlr_test.cpp tests/cpp/core_kv_cache_test.cpp)
target_include_directories(strata_mlr_tests PRIVATE src tests/cpp)
target_compile_options(strata_mlr_tests PRIVATE ${STRATA_WARNINGS})
target_link_libraries(strata_mlr_tests PRIVATE strata_core GTest::gtest GTest::gtest_main)
gtest_discover_tests(strata_mlr_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS core)
