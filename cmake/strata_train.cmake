# The training stack (included from the top-level CMakeLists.txt after strata_encoder.cmake, when
# LibTorch is there):
#   strata_train        LibTorch: run configs (TOML), checkpoints, the tasks (charlm / icr / ett)
#                       and the training loop                                   (models/)
#   strata_train_tests  GoogleTest, ctest -L train: configs, experiment files, checkpoints (torn / altered files),
#                       each task's smoke size, resume after a simulated kill reproducing the losses.
find_package(PkgConfig REQUIRED)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)

add_library(strata_train STATIC
  ${PROJECT_SOURCE_DIR}/models/checkpoint.cpp
  ${PROJECT_SOURCE_DIR}/models/experiment.cpp
  ${PROJECT_SOURCE_DIR}/models/generate.cpp
  ${PROJECT_SOURCE_DIR}/models/train_config.cpp
  ${PROJECT_SOURCE_DIR}/models/tasks.cpp
  ${PROJECT_SOURCE_DIR}/models/trainer.cpp
)
target_compile_options(strata_train PRIVATE ${STRATA_WARNINGS})
target_link_libraries(strata_train PUBLIC strata_models strata_data PkgConfig::TOMLPP)

add_executable(strata_train_tests ${PROJECT_SOURCE_DIR}/tests/cpp/train_test.cpp
                                  ${PROJECT_SOURCE_DIR}/tests/cpp/experiment_test.cpp)
target_compile_options(strata_train_tests PRIVATE ${STRATA_WARNINGS})
target_include_directories(strata_train_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests/cpp)
target_compile_definitions(strata_train_tests PRIVATE STRATA_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_link_libraries(strata_train_tests PRIVATE strata_train GTest::gtest GTest::gtest_main)
gtest_discover_tests(strata_train_tests DISCOVERY_TIMEOUT 120 PROPERTIES LABELS train)
