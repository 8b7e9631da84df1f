// models/attention_spec.h: the one-line specs of the attention methods a pretrained encoder can
// be converted to (models/attention_zoo.h runs them), and their parser. Torch-free, so that the
// grammar is fuzzed (tests/fuzz/) and tested under ASan with the other readers of user input.
//
// Spec strings: "<kind>" or "<kind>:<key>=<value>,<key>=<value>,..." (no spaces), keys per kind:
//   softmax                                   exact softmax attention (strata's dense kernel)
//   monarch    T=<int >= 1>       (1)         MonarchAttention, alternating-maximisation steps
//              B=<int >= 0>       (0)         block size; 0 = floor(sqrt(seq)) of each call
//              pad=post|pre       (post)      where N is zero-padded to a multiple of B
//              mode=stable|reference (stable) see include/strata/monarch.h
//   nystrom    landmarks=<int >= 1> (16)      Nystromformer, segment-mean landmarks
//              iters=<int >= 1>   (6)         iterations of the iterative pseudo-inverse
//   performer  features=<int >= 1> (64)       Performer, positive random features
//              seed=<int >= 0>    (none)      none: features redrawn on every call
// e.g. "softmax", "monarch:T=2,B=8,pad=post", "nystrom:landmarks=16", "performer:features=64,seed=0".
// Semantics of each method: torch/include/strata/torch/monarch.h and baselines.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/monarch.h"

namespace strata::models {

enum class AttentionKind { softmax, monarch, nystrom, performer };

struct AttentionSpec {
  AttentionKind kind = AttentionKind::softmax;
  // monarch
  int64_t num_steps = 1;         // T
  int64_t block_size = 0;        // B; 0 = floor(sqrt(seq)) per call
  MonarchPad pad = MonarchPad::post;       // spec "post" | "pre"
  MonarchMode mode = MonarchMode::stable;  // spec "stable" | "reference"
  // nystrom
  int64_t num_landmarks = 16;
  int64_t pinv_iters = 6;
  // performer
  int64_t num_features = 64;
  std::optional<int64_t> seed;   // none: redrawn on every call

  bool operator==(const AttentionSpec&) const = default;
};

// "softmax" | "monarch" | "nystrom" | "performer".
const char* kind_name(AttentionKind kind);

// Parses a spec string (grammar above), the one parse of a spec: pad and mode become the core's
// enums here. Throws strata::Error naming the bad part, e.g.
//   attention spec "monarch:T=0": key 'T': expected an integer >= 1, got "0"
//   attention spec "nystrom:B=4": unknown key 'B' for nystrom (expected one of: landmarks, iters)
AttentionSpec parse_attention_spec(const std::string& spec);

// The canonical spec string: every key of the kind, in the order of the grammar above, so that
// parse_attention_spec(to_string(s)) == s (fields of other kinds keep their defaults).
std::string to_string(const AttentionSpec& spec);

// Throws strata::Error naming the key when a field of the spec's kind is out of its range (for
// specs built in code; a parsed spec always passes).
void validate(const AttentionSpec& spec);

// One row: a method spec with the layers it replaces, "<spec>[@<layer>,<layer>...]", e.g.
// "monarch:T=2,B=8@3,4,5" (no @: every layer). Parsed once, by parse_conversion_method.
struct ConversionMethod {
  std::string spec_text;        // the spec as written (the row's label)
  AttentionSpec spec;           // parse_attention_spec(spec_text)
  std::vector<int64_t> layers;  // empty: all
  std::string label() const;    // spec_text[@layers]
};
// Throws strata::Error naming the bad part (the spec's own message, or the layer list's).
ConversionMethod parse_conversion_method(const std::string& text);
// The same with the layers given apart (`strata embed --layers`, strata.SentenceEncoder's
// layers): `layers` empty keeps text's own (@..., or all); else text must have no '@'.
ConversionMethod parse_conversion_method(const std::string& text, const std::vector<int64_t>& layers);

}  // namespace strata::models
