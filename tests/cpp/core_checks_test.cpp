// tests/cpp/core_checks_test.cpp: the argument checks every kernel family shares (strata/checks.h),
// run once for every family and every entry point that calls them: the kernels' forward and
// backward and the family's double references. A valid call (batch 1, seq 8, 2 query heads over
// 2 kv heads, head_dim 16, float32; in each layout) must run; each test breaks one argument and
// expects a strata::Error "<entry point>: argument '<name>': expected ..., got ..." that says
// what was expected and what came. The checks of one family's own options (windows, ranks, block
// sizes, segments, steps, ...) stay in that family's test file.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/attention.h"
#include "strata/mlr.h"
#include "strata/monarch.h"
#include "test_util.h"

namespace strata {
namespace {

// The arguments of one call in `layout`: every entry point takes those it needs.
struct Args {
  Layout layout = Layout::BSHD;
  TensorView q, k, v, o, lse, dout, dq, dk, dv, key_padding_mask;

  // The logical dim `which` ('b', 's', 'h' or 'd') of a 4-D argument, whatever the layout.
  int64_t& dim(TensorView& t, char which) const {
    const int s = layout == Layout::BSHD ? 1 : 2;
    return t.shape[which == 'b' ? 0 : which == 's' ? s : which == 'h' ? 3 - s : 3];
  }
  // Its stride (in elements).
  int64_t& stride(TensorView& t, char which) const {
    const int s = layout == Layout::BSHD ? 1 : 2;
    return t.stride[which == 'b' ? 0 : which == 's' ? s : which == 'h' ? 3 - s : 3];
  }
};

// The kinds of entry point, as bits: which arguments each takes follows from its kind.
enum Kind : unsigned { kForward = 1, kBackward = 2, kRefForward = 4, kRefBackward = 8 };
constexpr unsigned kKernels = kForward | kBackward, kReferences = kRefForward | kRefBackward,
                   kAll = kKernels | kReferences;

struct Entry {
  const char* name;  // the "where" of its errors
  Kind kind;
  std::function<void(const Args&)> call;
};

struct Family {
  const char* name;
  bool self_attention;       // k must have q's seq
  bool has_lse;              // the forward writes lse; the backward reads o and lse
  bool has_key_padding_mask;
  std::vector<Entry> entries;
};

// Where the references write (sized for every call below, broken ones included).
double* ref_out(int i) {
  static std::vector<std::vector<double>> bufs(5, std::vector<double>(1 << 14));
  return bufs[size_t(i)].data();
}

AttentionOptions dense_options(const Args& a) {
  AttentionOptions o;
  o.layout = a.layout;
  o.key_padding_mask = a.key_padding_mask;
  return o;
}
MlrOptions mlr_opts(const Args& a) {
  MlrOptions o = mlr_options({8, 4, 4});
  o.layout = a.layout;
  return o;
}
MonarchOptions monarch_options(const Args& a) {
  MonarchOptions o;
  o.layout = a.layout;
  o.key_padding_mask = a.key_padding_mask;
  return o;
}

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {"dense", false, true, true,
       {{"attention_forward", kForward,
         [](const Args& a) { attention_forward(a.q, a.k, a.v, a.o, a.lse, dense_options(a)); }},
        {"attention_backward", kBackward,
         [](const Args& a) {
           attention_backward(a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv, dense_options(a));
         }},
        {"reference::attention_forward", kRefForward,
         [](const Args& a) { reference::attention_forward(a.q, a.k, a.v, dense_options(a), ref_out(0), ref_out(1)); }},
        {"reference::attention_backward", kRefBackward, [](const Args& a) {
           reference::attention_backward(a.q, a.k, a.v, a.dout, dense_options(a), ref_out(2), ref_out(3), ref_out(4));
         }}}},
      {"mlr", false, true, false,
       {{"mlr_attention_forward", kForward,
         [](const Args& a) { mlr_attention_forward(a.q, a.k, a.v, a.o, a.lse, mlr_opts(a)); }},
        {"mlr_attention_backward", kBackward,
         [](const Args& a) {
           mlr_attention_backward(a.q, a.k, a.v, a.o, a.lse, a.dout, a.dq, a.dk, a.dv, mlr_opts(a));
         }},
        {"reference::mlr_attention_forward", kRefForward,
         [](const Args& a) { reference::mlr_attention_forward(a.q, a.k, a.v, mlr_opts(a), ref_out(0), ref_out(1)); }},
        {"reference::mlr_attention_backward", kRefBackward,
         [](const Args& a) {
           reference::mlr_attention_backward(a.q, a.k, a.v, a.dout, mlr_opts(a), ref_out(2), ref_out(3), ref_out(4));
         }},
        {"reference::mlr_attention_forward_blockwise", kRefForward,
         [](const Args& a) {
           reference::mlr_attention_forward_blockwise(a.q, a.k, a.v, mlr_opts(a), ref_out(0), ref_out(1));
         }},
        {"reference::mlr_attention_backward_blockwise", kRefBackward, [](const Args& a) {
           reference::mlr_attention_backward_blockwise(a.q, a.k, a.v, a.dout, mlr_opts(a), ref_out(2), ref_out(3),
                                                       ref_out(4));
         }}}},
      {"monarch", true, false, true,
       {{"monarch_attention_forward", kForward,
         [](const Args& a) { monarch_attention_forward(a.q, a.k, a.v, a.o, TensorView(), monarch_options(a)); }},
        {"monarch_attention_backward", kBackward,
         [](const Args& a) {
           monarch_attention_backward(a.q, a.k, a.v, TensorView(), a.dout, a.dq, a.dk, a.dv, monarch_options(a));
         }},
        {"reference::monarch_attention_forward", kRefForward,
         [](const Args& a) { reference::monarch_attention_forward(a.q, a.k, a.v, monarch_options(a), ref_out(0)); }},
        {"reference::monarch_attention_backward", kRefBackward, [](const Args& a) {
           reference::monarch_attention_backward(a.q, a.k, a.v, a.dout, monarch_options(a), ref_out(2), ref_out(3),
                                                 ref_out(4));
         }}}},
  };
  return f;
}

// A view of (b, s, h, d) in layout l over p, contiguous.
TensorView view4(void* p, DType t, Layout l, int64_t b, int64_t s, int64_t h, int64_t d) {
  return l == Layout::BSHD ? TensorView(p, t, {b, s, h, d}) : TensorView(p, t, {b, h, s, d});
}

// A valid call in layout l: q, k, v, dout read one buffer of 0.5; every output has its own.
Args valid_args(Layout l) {
  static std::vector<float> in(4096, 0.5f), o(4096), lse(4096), dq(4096), dk(4096), dv(4096);
  static std::vector<uint8_t> mask(64, 1);
  Args a;
  a.layout = l;
  a.q = a.k = a.v = a.dout = view4(in.data(), DType::f32, l, 1, 8, 2, 16);
  a.o = view4(o.data(), DType::f32, l, 1, 8, 2, 16);
  a.dq = view4(dq.data(), DType::f32, l, 1, 8, 2, 16);
  a.dk = view4(dk.data(), DType::f32, l, 1, 8, 2, 16);
  a.dv = view4(dv.data(), DType::f32, l, 1, 8, 2, 16);
  a.lse = TensorView(lse.data(), DType::f32, {1, 2, 8});
  a.key_padding_mask = TensorView(mask.data(), DType::u8, {1, 8});
  return a;
}

using Break = std::function<void(Args&)>;

// One family (the test's parameter) and its entry points.
class SharedChecks : public ::testing::TestWithParam<std::string> {
 protected:
  const Family& fam() const {
    for (const Family& f : families())
      if (GetParam() == f.name) return f;
    throw Error("no family " + GetParam());
  }
  // The kinds of entry point that take argument `arg` in this family.
  unsigned takes(const std::string& arg) const {
    const Family& f = fam();
    if (arg == "o") return kForward | (f.has_lse ? kBackward : 0u);
    if (arg == "lse") return f.has_lse ? kKernels : 0u;
    if (arg == "dout") return kBackward | kRefBackward;
    if (arg == "dq" || arg == "dk" || arg == "dv") return kBackward;
    if (arg == "key_padding_mask") return f.has_key_padding_mask ? kAll : 0u;
    return kAll;  // q, k, v, layout
  }
  // Every entry point of a kind in `kinds`, in both layouts, called with a valid call that `bad`
  // breaks, throws an error naming itself and argument `named`, with every needle in it.
  void expect_rejected(unsigned kinds, const char* named, const Break& bad, std::vector<std::string> needles) const {
    ASSERT_NE(kinds, 0u) << "no entry point of " << fam().name << " takes '" << named << "'";
    for (Layout l : {Layout::BSHD, Layout::BHSD})
      for (const Entry& e : fam().entries) {
        if (!(e.kind & kinds)) continue;
        SCOPED_TRACE(detail::cat(e.name, l == Layout::BSHD ? " (BSHD)" : " (BHSD)"));
        Args a = valid_args(l);
        bad(a);
        std::vector<std::string> all = needles;
        all.push_back(detail::cat(e.name, ": argument '", named, "': expected"));
        test::expect_error([&] { e.call(a); }, all);
      }
  }
  // The same where the broken argument is the one named.
  void expect_rejected(const char* named, const Break& bad, std::vector<std::string> needles) const {
    expect_rejected(takes(named), named, bad, std::move(needles));
  }
};

// The fields of Args by name, for the tests that break each in turn.
TensorView& arg(Args& a, const std::string& name) {
  if (name == "q") return a.q;
  if (name == "k") return a.k;
  if (name == "v") return a.v;
  if (name == "o") return a.o;
  if (name == "lse") return a.lse;
  if (name == "dout") return a.dout;
  if (name == "dq") return a.dq;
  if (name == "dk") return a.dk;
  if (name == "dv") return a.dv;
  return a.key_padding_mask;
}

const char* const kTensors4d[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};

TEST_P(SharedChecks, ValidCallRunsEverywhere) {  // so the errors below come from what each test breaks
  for (Layout l : {Layout::BSHD, Layout::BHSD})
    for (const Entry& e : fam().entries) {
      SCOPED_TRACE(detail::cat(e.name, l == Layout::BSHD ? " (BSHD)" : " (BHSD)"));
      EXPECT_NO_THROW(e.call(valid_args(l)));
    }
}

TEST_P(SharedChecks, WrongRank) {
  for (const char* name : kTensors4d) {
    SCOPED_TRACE(name);
    expect_rejected(name, [&](Args& a) { arg(a, name).ndim = 3; }, {"4-D", "3-D"});
  }
}

TEST_P(SharedChecks, NegativeSizesAreErrorsNamingTheArgument) {
  // A negative size would otherwise read as "nothing to do" and return without writing.
  for (const char* name : {"q", "k", "v"})
    for (char d : {'b', 's', 'h', 'd'}) {
      SCOPED_TRACE(detail::cat(name, " dim ", d));
      expect_rejected(name, [&](Args& a) { a.dim(arg(a, name), d) = -2; }, {"sizes >= 0"});
    }
}

TEST_P(SharedChecks, NegativeBatchWithEmptyOutputIsAnError) {
  // The case that used to return silently: a negative batch everywhere makes every loop empty.
  expect_rejected(kAll, "q",
                  [](Args& a) {
                    for (const char* name : kTensors4d) a.dim(arg(a, name), 'b') = -1;
                    a.lse.shape[0] = a.key_padding_mask.shape[0] = -1;
                  },
                  {"sizes >= 0"});
}

TEST_P(SharedChecks, NullData) {
  for (const char* name : {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv"}) {
    if (!takes(name)) continue;  // lse: a family without one
    SCOPED_TRACE(name);
    expect_rejected(name, [&](Args& a) { arg(a, name).data = nullptr; }, {"non-null", "got null"});
  }
}

TEST_P(SharedChecks, MixedDtypes) {  // every tensor has q's dtype
  for (const char* name : kTensors4d) {
    if (name == std::string("q")) continue;
    SCOPED_TRACE(name);
    expect_rejected(name, [&](Args& a) { arg(a, name).dtype = DType::bf16; }, {"float32", "bfloat16"});
  }
}

TEST_P(SharedChecks, UnsupportedDtype) {
  const Break f16 = [](Args& a) { a.q.dtype = a.k.dtype = a.v.dtype = DType::f16; };
  expect_rejected(kKernels, "q", f16, {"float32 or bfloat16", "got float16"});
  expect_rejected(kReferences, "q", f16, {"float32, bfloat16 or float64", "got float16"});
}

TEST_P(SharedChecks, KernelsRejectFloat64) {  // the references read it (finite differences)
  expect_rejected(kKernels, "q", [](Args& a) { a.q.dtype = a.k.dtype = a.v.dtype = DType::f64; },
                  {"float32 or bfloat16", "got float64"});
}

TEST_P(SharedChecks, ZeroHeadDim) {
  expect_rejected("q", [](Args& a) { a.dim(a.q, 'd') = a.dim(a.k, 'd') = 0; }, {"head_dim >= 1", "got 0"});
}

TEST_P(SharedChecks, ZeroHeadDimV) {
  expect_rejected(kAll, "v", [](Args& a) { a.dim(a.v, 'd') = a.dim(a.o, 'd') = a.dim(a.dout, 'd') = 0; },
                  {"head_dim_v >= 1", "got 0"});
}

TEST_P(SharedChecks, ZeroHeads) {
  expect_rejected("q", [](Args& a) { a.dim(a.q, 'h') = 0; }, {"heads >= 1", "got 0"});
  expect_rejected("k", [](Args& a) { a.dim(a.k, 'h') = a.dim(a.v, 'h') = 0; }, {"heads >= 1", "got 0"});
}

TEST_P(SharedChecks, HeadsNotDividing) {
  expect_rejected(kAll, "k",
                  [](Args& a) {
                    for (TensorView* t : {&a.q, &a.o, &a.dout, &a.dq}) a.dim(*t, 'h') = 3;
                    a.lse.shape[1] = 3;
                  },
                  {"heads dividing q's heads (3)", "got 2"});
}

TEST_P(SharedChecks, KeysOfAnotherHeadDimOrBatch) {
  expect_rejected("k", [](Args& a) { a.dim(a.k, 'd') = 15; }, {"dim=16", "dim=15"});
  expect_rejected("k", [](Args& a) { a.dim(a.k, 'b') = 2; }, {"batch=1", "batch=2"});
}

TEST_P(SharedChecks, ValuesOfAnotherBatchSeqOrHeads) {
  expect_rejected("v", [](Args& a) { a.dim(a.v, 'b') = 2; }, {"batch=1", "batch=2"});
  expect_rejected("v", [](Args& a) { a.dim(a.v, 's') = 9; }, {"seq=8", "seq=9"});
  expect_rejected("v", [](Args& a) { a.dim(a.v, 'h') = 1; }, {"heads=2", "heads=1"});
}

TEST_P(SharedChecks, CrossAttentionOnlyWhereTheFamilyHasIt) {
  const Break longer_keys = [](Args& a) { a.dim(a.k, 's') = a.dim(a.v, 's') = 9; };
  if (fam().self_attention) {
    expect_rejected("k", longer_keys, {"seq=8", "seq=9", "self-attention"});
    return;
  }
  for (Layout l : {Layout::BSHD, Layout::BHSD})
    for (const Entry& e : fam().entries) {
      SCOPED_TRACE(e.name);
      Args a = valid_args(l);
      longer_keys(a);
      // dk, dv of 9 keys laid out afresh: stretching the 8-key views would, in BHSD, write head 0's
      // last key over head 1's first (the dense family rejects such overlapping outputs).
      a.dk = view4(a.dk.data, DType::f32, l, 1, 9, 2, 16);
      a.dv = view4(a.dv.data, DType::f32, l, 1, 9, 2, 16);
      a.key_padding_mask.shape[1] = 9;
      EXPECT_NO_THROW(e.call(a));
    }
}

TEST_P(SharedChecks, UnknownLayout) {
  expect_rejected("layout", [](Args& a) { a.layout = Layout(2); }, {"BSHD or BHSD", "got 2"});
}

TEST_P(SharedChecks, OutputOfAnotherShape) {
  expect_rejected("o", [](Args& a) { a.dim(a.o, 's') = 9; }, {"seq=8", "seq=9"});
  expect_rejected("o", [](Args& a) { a.dim(a.o, 'h') = 1; }, {"heads=2", "heads=1"});
  expect_rejected("o", [](Args& a) { a.dim(a.o, 'd') = 8; }, {"dim=16", "dim=8"});
}

TEST_P(SharedChecks, GradientsOfAnotherShape) {
  expect_rejected("dout", [](Args& a) { a.dim(a.dout, 's') = 5; }, {"seq=8", "seq=5", "(same as o)"});
  expect_rejected("dq", [](Args& a) { a.dim(a.dq, 's') = 5; }, {"seq=8", "seq=5", "(same as q)"});
  expect_rejected("dk", [](Args& a) { a.dim(a.dk, 'h') = 1; }, {"heads=2", "heads=1", "(same as k)"});
  expect_rejected("dv", [](Args& a) { a.dim(a.dv, 'd') = 8; }, {"dim=16", "dim=8", "(same as v)"});
}

// An output whose elements overlap (a stride-0 dim, as torch's expand() makes) would have its rows
// written over one another: every family's kernels refuse it (strata/checks.h, check_no_overlap).
TEST_P(SharedChecks, OverlappingOutputs) {
  const std::vector<std::string> needles = {"do not overlap", "stride 0"};
  expect_rejected("o", [](Args& a) { a.stride(a.o, 'h') = 0; }, needles);
  expect_rejected("dq", [](Args& a) { a.stride(a.dq, 's') = 0; }, needles);
  expect_rejected("dk", [](Args& a) { a.stride(a.dk, 'h') = 0; }, needles);
  expect_rejected("dv", [](Args& a) { a.stride(a.dv, 'd') = 0; }, needles);
}

// The families with an lse, and those that take a key padding mask.
class LseChecks : public SharedChecks {};
class MaskChecks : public SharedChecks {};

TEST_P(LseChecks, LseOfAnotherShapeOrDtype) {
  expect_rejected("lse", [](Args& a) { a.lse.shape[2] = 7; }, {"[1, 2, 8]", "[1, 2, 7]"});
  expect_rejected("lse", [](Args& a) { a.lse.ndim = 4; }, {"[1, 2, 8]"});
  expect_rejected("lse", [](Args& a) { a.lse.dtype = DType::bf16; }, {"float32", "bfloat16"});
}

TEST_P(MaskChecks, KeyPaddingMaskOfAnotherShapeOrDtype) {
  const char* m = "key_padding_mask";
  expect_rejected(m, [](Args& a) { a.key_padding_mask.shape[1] = 7; }, {"[1, 8]", "[1, 7]"});
  expect_rejected(m, [](Args& a) { a.key_padding_mask.dtype = DType::f32; }, {"uint8", "float32"});
  expect_rejected(m, [](Args& a) { a.key_padding_mask.data = nullptr; }, {"non-null"});
}

// Stretches logical dim `which` of t to n rows with every stride but the last 0 (an expanded view
// of one row): 2^24 rows from a small buffer.
void stretch(Args& a, TensorView& t, char which, int64_t n) {
  a.dim(t, which) = n;
  for (int i = 0; i + 1 < t.ndim; ++i) t.stride[i] = 0;
}

TEST_P(SharedChecks, SequencesPast2To24AreErrors) {
  // Positions are compared in fp32 lanes, exact up to 2^24.
  const int64_t n = kMaxSeqLen;
  const bool self_attention = fam().self_attention;
  const Break long_queries = [=](Args& a) {
    for (TensorView* t : {&a.q, &a.o, &a.dout, &a.dq}) stretch(a, *t, 's', n);
    a.lse.shape[2] = n;
    a.lse.stride[0] = a.lse.stride[1] = 0;
    if (self_attention)
      for (TensorView* t : {&a.k, &a.v, &a.dk, &a.dv}) stretch(a, *t, 's', n);
  };
  expect_rejected("q", long_queries, {"seq < 2^24", detail::cat("got ", n)});
  if (self_attention) return;
  const Break long_keys = [=](Args& a) {
    for (TensorView* t : {&a.k, &a.v, &a.dk, &a.dv}) stretch(a, *t, 's', n);
  };
  expect_rejected("k", long_keys, {"seq < 2^24", detail::cat("got ", n)});
}

// The names of the families for which pred holds.
std::vector<std::string> family_names(bool (*pred)(const Family&)) {
  std::vector<std::string> v;
  for (const Family& f : families())
    if (pred(f)) v.push_back(f.name);
  return v;
}
std::string param_name(const ::testing::TestParamInfo<std::string>& i) { return i.param; }

bool every(const Family&) { return true; }
bool with_lse(const Family& f) { return f.has_lse; }
bool with_mask(const Family& f) { return f.has_key_padding_mask; }

INSTANTIATE_TEST_SUITE_P(Families, SharedChecks, ::testing::ValuesIn(family_names(every)), param_name);
INSTANTIATE_TEST_SUITE_P(Families, LseChecks, ::testing::ValuesIn(family_names(with_lse)), param_name);
INSTANTIATE_TEST_SUITE_P(Families, MaskChecks, ::testing::ValuesIn(family_names(with_mask)), param_name);

}  // namespace
}  // namespace strata
