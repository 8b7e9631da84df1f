// tests/cpp/core_checks_test.cpp: the argument checks every kernel family shares (src/cpu/views.h),
// run once per family: negative sizes (which a family would otherwise treat as "nothing to do"
// and return without writing) and sequences past the 2^24 positions the kernels compare exactly
// in fp32 lanes. Each must be a strata::Error that names the argument.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/attention.h"
#include "strata/mlr.h"
#include "strata/monarch.h"

namespace strata {
namespace {

// Expects fn to throw strata::Error whose message contains every needle.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
  }
}

// One family's forward over (q, k, v, o): dense, MLR (two levels) or Monarch.
using Forward = std::function<void(const TensorView&, const TensorView&, const TensorView&, const TensorView&)>;

struct Family {
  const char* name;
  Forward fwd;
};

std::vector<Family> families() {
  static std::vector<float> lse(1 << 12);
  auto lse_for = [](const TensorView& q) {  // B x H x N, sized from q (BSHD)
    return TensorView(lse.data(), DType::f32, {q.shape[0], q.shape[2], q.shape[1]});
  };
  return {
      {"dense",
       [=](auto& q, auto& k, auto& v, auto& o) { attention_forward(q, k, v, o, lse_for(q), AttentionOptions{}); }},
      {"mlr",
       [=](auto& q, auto& k, auto& v, auto& o) { mlr_attention_forward(q, k, v, o, lse_for(q), mlr_options({8, 8})); }},
      {"monarch",
       [=](auto& q, auto& k, auto& v, auto& o) {
         MonarchOptions m;
         monarch_attention_forward(q, k, v, o, TensorView{}, m);
       }},
  };
}

TEST(SharedChecks, NegativeSizesAreErrorsNamingTheArgument) {
  std::vector<float> buf(4096, 0.5f), out(4096);
  for (const Family& f : families())
    for (int dim = 0; dim < 4; ++dim)
      for (const char* arg : {"q", "k", "v"}) {
        SCOPED_TRACE(detail::cat(f.name, ": ", arg, " dim ", dim));
        TensorView q(buf.data(), DType::f32, {1, 8, 2, 16}), k = q, v = q;
        TensorView o(out.data(), DType::f32, {1, 8, 2, 16});
        TensorView& bad = arg[0] == 'q' ? q : arg[0] == 'k' ? k : v;
        bad.shape[dim] = -2;
        expect_error([&] { f.fwd(q, k, v, o); }, {detail::cat("'", arg, "'"), "sizes >= 0"});
      }
}

TEST(SharedChecks, NegativeBatchWithEmptyOutputIsAnError) {
  // The case that used to return silently: a negative batch makes every loop empty.
  std::vector<float> buf(64, 0.5f);
  for (const Family& f : families()) {
    SCOPED_TRACE(f.name);
    TensorView q(buf.data(), DType::f32, {-1, 4, 1, 16}), k = q, v = q, o = q;
    expect_error([&] { f.fwd(q, k, v, o); }, {"'q'", "sizes >= 0"});
  }
}

// A view whose every dim but the last has stride 0 (an expanded view of one row).
TensorView expanded(float* p, std::initializer_list<int64_t> dims) {
  TensorView t(p, DType::f32, dims);
  for (int i = 0; i + 1 < t.ndim; ++i) t.stride[i] = 0;
  return t;
}

TEST(SharedChecks, SequencesPast2To24AreErrors) {
  // An expanded view (stride 0 along the sequence) reaches 2^24 rows with a small buffer.
  std::vector<float> buf(64, 0.5f), out(64);
  const int64_t n = int64_t(1) << 24;
  for (const char* fam : {"dense", "mlr"})
    for (bool on_q : {true, false}) {
      SCOPED_TRACE(detail::cat(fam, on_q ? " q" : " k"));
      const TensorView big = expanded(buf.data(), {1, n, 1, 16}), small(buf.data(), DType::f32, {1, 4, 1, 16});
      const TensorView o = expanded(out.data(), {1, on_q ? n : 4, 1, 16});
      const TensorView &q = on_q ? big : small, &kv = on_q ? small : big;
      std::vector<float> lse(4);
      const TensorView l = expanded(lse.data(), {1, 1, q.shape[1]});
      auto run = [&] {
        if (std::string(fam) == "dense")
          attention_forward(q, kv, kv, o, l, AttentionOptions{});
        else
          mlr_attention_forward(q, kv, kv, o, l, mlr_options({8, 8}));
      };
      expect_error(run, {on_q ? "'q'" : "'k'", "seq < 2^24"});
    }
}

}  // namespace
}  // namespace strata
