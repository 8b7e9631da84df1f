# The pretrained-encoder stack of the zero-shot conversion (docs/methods.md) (included from the top-level
# CMakeLists.txt after torch/):
#   strata_data     torch-free: safetensors reader, SHA-256, WordPiece tokenizer, STS-B loader
#                   and Spearman, model-directory and shared-data lookup; the training datasets
#                   (char corpora, in-context regression, ETTh1)                (data/);
#                   the readers of user input in models/ (the spec grammars of the attention
#                   options, a checkpoint's metadata: models/attention_spec.cpp,
#                   layer_attention_spec.cpp, checkpoint_meta.cpp), torch-free so that they are fuzzed
#   strata_models   LibTorch: the BERT encoder with pluggable attention, the attention zoo it
#                   converts to (softmax / Monarch / Nystrom / Performer) and the conversion
#                   evaluation (STS-B, long passages, FLOPs)                      (models/)
#   strata_encoder  LibTorch, shared: torch.classes.strata.SentenceEncoder, the converted encoder
#                   for Python (models/encoder_class.cpp; python/strata/encoder.py loads
#                   libstrata_encoder.so from beside libstrata_torch.so, which stays free of
#                   models/ and data/). Also built for the pip package (STRATA_BUILD_ENCODER).
#   strata_encoder_tests  GoogleTest, ctest -L encoder (only with STRATA_BUILD_CLI). Without
#                   strata_torch (a torch-free configuration that includes this file) it holds only
#                   the data_* tests, so the fuzz test also runs under ASan + UBSan.
# The model itself comes from scripts/setup_encoder.sh; tests that need it skip without it.
find_package(nlohmann_json 3 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)

add_library(strata_data STATIC
  ${PROJECT_SOURCE_DIR}/data/char_corpus.cpp
  ${PROJECT_SOURCE_DIR}/data/ett.cpp
  ${PROJECT_SOURCE_DIR}/data/files.cpp
  ${PROJECT_SOURCE_DIR}/data/icr.cpp
  ${PROJECT_SOURCE_DIR}/data/minilm.cpp
  ${PROJECT_SOURCE_DIR}/data/npy.cpp
  ${PROJECT_SOURCE_DIR}/data/safetensors.cpp
  ${PROJECT_SOURCE_DIR}/data/sha256.cpp
  ${PROJECT_SOURCE_DIR}/data/shared_files.cpp
  ${PROJECT_SOURCE_DIR}/data/sts.cpp
  ${PROJECT_SOURCE_DIR}/data/wordpiece.cpp
  ${PROJECT_SOURCE_DIR}/models/attention_spec.cpp
  ${PROJECT_SOURCE_DIR}/models/checkpoint_meta.cpp
  ${PROJECT_SOURCE_DIR}/models/layer_attention_spec.cpp
)
# Headers are included as "data/....h" and "models/....h".
target_include_directories(strata_data PUBLIC ${PROJECT_SOURCE_DIR})
target_compile_options(strata_data PRIVATE ${STRATA_WARNINGS})
target_link_libraries(strata_data PUBLIC strata_core nlohmann_json::nlohmann_json PkgConfig::UTF8PROC)
# find_shared_file (data/shared_files.h) looks for shared/ in or beside the source tree.
target_compile_definitions(strata_data PRIVATE STRATA_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

set(STRATA_ENCODER_TEST_SOURCES
  ${PROJECT_SOURCE_DIR}/tests/cpp/data_minilm_test.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpp/data_npy_test.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpp/data_safetensors_test.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpp/data_sts_test.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpp/data_train_test.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpp/data_wordpiece_test.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpp/models_readers_test.cpp
)
set(STRATA_ENCODER_TEST_LIBS strata_data)

if(TARGET strata_torch)
  add_library(strata_models STATIC
    ${PROJECT_SOURCE_DIR}/models/bert_encoder.cpp
    ${PROJECT_SOURCE_DIR}/models/attention_zoo.cpp
    ${PROJECT_SOURCE_DIR}/models/conversion.cpp
    ${PROJECT_SOURCE_DIR}/models/layer_attention.cpp
    ${PROJECT_SOURCE_DIR}/models/decoder.cpp
    ${PROJECT_SOURCE_DIR}/models/forecaster.cpp)
  target_compile_options(strata_models PRIVATE ${STRATA_WARNINGS})
  target_link_libraries(strata_models PUBLIC strata_data strata_torch)
  list(APPEND STRATA_ENCODER_TEST_SOURCES
    ${PROJECT_SOURCE_DIR}/tests/cpp/encoder_bert_test.cpp
    ${PROJECT_SOURCE_DIR}/tests/cpp/encoder_convert_test.cpp
    ${PROJECT_SOURCE_DIR}/tests/cpp/encoder_embed_test.cpp
    ${PROJECT_SOURCE_DIR}/tests/cpp/encoder_reference_data.cpp
  )
  list(APPEND STRATA_ENCODER_TEST_LIBS strata_models)

  add_library(strata_encoder SHARED ${PROJECT_SOURCE_DIR}/models/encoder_class.cpp)
  target_compile_options(strata_encoder PRIVATE ${STRATA_WARNINGS})
  target_link_libraries(strata_encoder PRIVATE strata_models)
  # Beside libstrata_torch.so (build/<config>/torch/), where python/strata/encoder.py looks.
  set_target_properties(strata_encoder PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/torch)
endif()

if(NOT STRATA_BUILD_CLI)  # the pip package: no GoogleTest
  return()
endif()

add_executable(strata_encoder_tests ${STRATA_ENCODER_TEST_SOURCES})
target_compile_options(strata_encoder_tests PRIVATE ${STRATA_WARNINGS})
target_link_libraries(strata_encoder_tests PRIVATE ${STRATA_ENCODER_TEST_LIBS} GTest::gtest GTest::gtest_main)
gtest_discover_tests(strata_encoder_tests DISCOVERY_TIMEOUT 120 PROPERTIES LABELS encoder)

# The trained models (models/layer_attention.h, decoder.h, forecaster.h): ctest -L models.
if(TARGET strata_torch)
  add_executable(strata_models_tests ${PROJECT_SOURCE_DIR}/tests/cpp/models_train_test.cpp)
  target_compile_options(strata_models_tests PRIVATE ${STRATA_WARNINGS})
  target_link_libraries(strata_models_tests PRIVATE strata_models GTest::gtest GTest::gtest_main)
  gtest_discover_tests(strata_models_tests DISCOVERY_TIMEOUT 120 PROPERTIES LABELS models)
endif()
