// tests/cpp/models_readers_test.cpp: the torch-free readers of user input in models/ (the ones
// tests/fuzz/ fuzzes), in the ASan + UBSan build too: a checkpoint's metadata
// (models/checkpoint_meta.h) and the two attention spec grammars (models/attention_spec.h,
// models/layer_attention_spec.h). Their use with tensors is tested in train_test.cpp and
// models_*_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "models/attention_spec.h"
#include "models/checkpoint_meta.h"
#include "models/layer_attention_spec.h"
#include "test_util.h"

namespace {

namespace sm = strata::models;
using strata::test::expect_error;

const std::string kSha(64, 'a');

std::string meta(const std::string& safetensors, const std::string& step = "3", const std::string& sha = kSha) {
  return R"({"format": "strata-checkpoint/1", "step": )" + step + R"(, "safetensors": ")" + safetensors +
         R"(", "bytes": 10, "sha256": ")" + sha + R"(", "config": "task = 'icr'"})";
}

TEST(ModelsReaders, CheckpointMetaFields) {
  const sm::CheckpointMeta m = sm::parse_checkpoint_meta(meta("step-00000003.safetensors"), "m.json");
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.safetensors, "step-00000003.safetensors");
  EXPECT_EQ(m.bytes, 10u);
  EXPECT_EQ(m.sha256, kSha);
  EXPECT_EQ(m.json["config"], "task = 'icr'");
}

TEST(ModelsReaders, CheckpointMetaErrorsNameTheFileAndField) {
  const auto bad = [](const std::string& text, std::initializer_list<std::string> needles) {
    expect_error([&] { sm::parse_checkpoint_meta(text, "m.json"); }, needles);
  };
  bad("{\"format\": ", {"checkpoint 'm.json'", "not valid JSON"});
  bad("[1, 2]", {"checkpoint 'm.json'", "not a JSON object", "array"});
  bad("{}", {"metadata has no 'format'"});
  bad(R"({"format": "other/1"})", {"format 'other/1'", "strata-checkpoint/1"});
  bad(R"({"format": "strata-checkpoint/1", "step": "3"})", {"metadata 'step' has the wrong type"});
  bad(meta("x.safetensors", "-1"), {"'step' is -1", ">= 0"});
  // Integers are integer literals in range (a float was cast: 5.9e69 -> uint64 is undefined
  // behaviour under UBSan; 10.5 was read as 10; 2^63 wrapped to a negative step).
  bad(meta("x.safetensors", "10.5"), {"metadata 'step' is 10.5", "an integer"});
  bad(meta("x.safetensors", "9223372036854775808"), {"metadata 'step'", "fits in 64 bits"});
  std::string huge = meta("x.safetensors");
  huge.replace(huge.find("\"bytes\": 10"), 11, "\"bytes\": 5.9e69");
  bad(huge, {"metadata 'bytes' is 5.9e+69", "an integer >= 0"});
  // The tensor file stays in the metadata's folder (a path in it would read any file).
  bad(meta("../../etc/passwd"), {"metadata 'safetensors'", "../../etc/passwd", "file name"});
  bad(meta(".."), {"metadata 'safetensors'"});
  bad(meta(""), {"metadata 'safetensors'"});
  bad(meta("x.safetensors", "3", "ABC"), {"metadata 'sha256'", "64 lowercase hex digits"});
  bad(meta("x.safetensors", "3", std::string(64, 'G')), {"metadata 'sha256'"});
}

TEST(ModelsReaders, LayerSpecsRoundTripThroughTheirCanonicalString) {
  for (const char* p : {"mha", "MHA|SWA:w=64|swa:w=64", "gswa:split=32|32,w=512", "longformer:global=16,w=64",
                        "mlr:ranks=32|8|6|4|4|4|4|2,avg=1", "mlr:ranks=48|16|mha", "btt:s=1,logit=mup",
                        "bmlr:ranks=8|8|8|8,div=1", "monarch:T=2,B=8", "sdpa:scale=1/sqrt(d)"}) {
    const auto specs = sm::parse_attention_pattern(p, 6);
    ASSERT_EQ(specs.size(), 6u) << p;
    EXPECT_EQ(sm::parse_attention_pattern(sm::pattern_to_string(specs), 6), specs) << p;
  }
  expect_error([] { sm::parse_attention_pattern("mha|swa:w=1|mha", 4); }, {"has 3 specs", "multiple of 3"});
  expect_error([] { sm::parse_layer_attention("swa:w=99999999999999999999"); }, {"key 'w'"});
  expect_error([] { sm::parse_layer_attention("flash"); }, {"unknown kind 'flash'"});
}

TEST(ModelsReaders, ConversionSpecsRoundTripAndNameTheBadPart) {
  for (const char* s : {"softmax", "monarch:T=2,B=8,pad=pre,mode=reference@3,4,5", "nystrom:landmarks=16,iters=6",
                        "performer:features=64,seed=0", "performer:features=64"}) {
    const sm::ConversionMethod m = sm::parse_conversion_method(s);
    EXPECT_EQ(sm::parse_attention_spec(sm::to_string(m.spec)), m.spec) << s;
    EXPECT_EQ(sm::parse_conversion_method(m.label()).layers, m.layers) << s;
  }
  expect_error([] { sm::parse_conversion_method("monarch:T=0"); }, {"key 'T'", ">= 1"});
  expect_error([] { sm::parse_conversion_method("softmax@1,x"); }, {"'layers'", "\"x\""});
  expect_error([] { sm::parse_conversion_method("softmax@"); }, {"'layers'"});
  sm::AttentionSpec bad;
  bad.kind = sm::AttentionKind::nystrom;
  bad.num_landmarks = 0;
  expect_error([&] { sm::validate(bad); }, {"key 'landmarks'"});
}

}  // namespace
