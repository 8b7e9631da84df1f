# MonarchAttention (issue 4): the CPU kernel in strata_core and its tests. Included by the top-level
# CMakeLists.txt after strata_core_tests is defined.
target_sources(strata_core PRIVATE
  src/cpu/monarch.cpp
  src/cpu/monarch_avx512.cpp
  src/cpu/monarch_avx2.cpp
  src/cpu/monarch_scalar.cpp
  src/cpu/reference/monarch_reference.cpp
)
# One translation unit per ISA (same flags as attention_*.cpp); run-time dispatch picks one.
set_source_files_properties(src/cpu/monarch_avx512.cpp PROPERTIES COMPILE_OPTIONS
  "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-ffp-contract=fast;-Wno-maybe-uninitialized")
set_source_files_properties(src/cpu/monarch_avx2.cpp PROPERTIES COMPILE_OPTIONS
  "-mavx2;-mfma;-ffp-contract=fast")

add_executable(strata_monarch_tests tests/cpp/core_monarch_test.cpp)
target_include_directories(strata_monarch_tests PRIVATE src tests/cpp)
target_compile_options(strata_monarch_tests PRIVATE ${STRATA_WARNINGS})
target_link_libraries(strata_monarch_tests PRIVATE strata_core GTest::gtest GTest::gtest_main)
gtest_discover_tests(strata_monarch_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS core)
