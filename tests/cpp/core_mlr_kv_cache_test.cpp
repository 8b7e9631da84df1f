// tests/cpp/core_mlr_kv_cache_test.cpp: the MLR decode cache. Decoding a batch of sequences of
// different lengths (prefill, then one token at a time) must reproduce, row by row, the full MLR
// forward over each sequence, across every level's block transitions (blocks 64/32/16/8 over up
// to 150 tokens, so level 1 changes block too); plus its memory figures and bad input.
//
// Tolerance: the cache and the kernel sum the same fp32 terms in different orders (and the kernel
// uses exp2 of base-2 logits): 2e-5 normwise as core_mlr_test.cpp's forward. bf16: both round
// the output to bf16 (one ulp apart at most, 2^-8 = 4e-3): 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "strata/mlr_kv_cache.h"
#include "strata/mlr.h"
#include "test_util.h"

namespace strata {
namespace {

using test::Owned4;

struct Seq {  // one sequence's full q, k, v and the full forward's o, lse
  Owned4 q, k, v, o;
  std::vector<float> lse;
};

struct DecodeCase {
  DecodeCase(const char* n, const MlrOptions& o) : name(n), opt(o) {}
  const char* name;
  MlrOptions opt;
  DType dtype = DType::f32;
  // Per-sequence segment starts (empty: none). listed: given to the cache as segment_offsets
  // lists; otherwise announced with begin_segment() as decoding reaches them (they must lie after
  // the prompt), the cache getting empty lists (segment mode).
  std::vector<std::vector<int64_t>> segments;
  bool listed = true;
};

void run_decode(const DecodeCase& dc, const std::vector<int64_t>& total, const std::vector<int64_t>& prompt,
                int64_t max_seqlen) {
  SCOPED_TRACE(dc.name);
  const int64_t B = int64_t(total.size()), Hq = 4, Hkv = 2, Dv = 12;
  MlrOptions opt = dc.opt;
  const bool seg = !dc.segments.empty();
  std::vector<int64_t> seg_flat, seg_off{0};
  for (int64_t b = 0; seg && b < B; ++b) {
    if (dc.listed) seg_flat.insert(seg_flat.end(), dc.segments[size_t(b)].begin(), dc.segments[size_t(b)].end());
    seg_off.push_back(int64_t(seg_flat.size()));
  }
  int64_t D = 0;
  for (int l = 0; l < opt.num_levels; ++l) D += opt.ranks[l];
  const Layout L = opt.layout;
  std::mt19937 rng(11);
  std::vector<Seq> seqs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    Seq& s = seqs[size_t(b)];
    const int64_t T = total[size_t(b)];
    s.q = Owned4(1, T, Hq, D, dc.dtype, L);
    s.k = Owned4(1, T, Hkv, D, dc.dtype, L);
    s.v = Owned4(1, T, Hkv, Dv, dc.dtype, L);
    s.o = Owned4(1, T, Hq, Dv, dc.dtype, L);
    s.q.fill_random(rng, -2, 2);
    s.k.fill_random(rng, -2, 2);
    s.v.fill_random(rng);
    s.lse.resize(size_t(Hq * T));
    MlrOptions fo = opt;  // the forward over this sequence alone, with its own segment list
    std::vector<int64_t> mine;
    if (seg)
      for (int64_t x : dc.segments[size_t(b)])
        if (x < T) mine.push_back(x);
    if (seg) {
      fo.segment_starts = mine.data();
      fo.num_segment_starts = int64_t(mine.size());
      if (mine.empty()) {  // one segment: per-sequence form with an empty list
        static const int64_t kEmpty[2] = {0, 0};
        fo.segment_offsets = kEmpty;
        fo.num_segment_offsets = 2;
      }
    }
    mlr_attention_forward(s.q.view, s.k.view, s.v.view, s.o.view, TensorView(s.lse.data(), DType::f32, {1, Hq, T}),
                          fo);
  }
  if (seg) {
    opt.segment_starts = seg_flat.data();
    opt.num_segment_starts = int64_t(seg_flat.size());
    opt.segment_offsets = seg_off.data();
    opt.num_segment_offsets = int64_t(seg_off.size());
  }
  MlrKvCache cache(B, Hkv, Dv, max_seqlen, opt);
  seg_flat.assign(seg_flat.size(), -7);  // the cache copied the lists
  // Copies rows [from, from + n[b]) of every sequence's t (k or v) into a batch tensor.
  auto gather = [&](Owned4 Seq::*field, int64_t heads, int64_t d, const std::vector<int64_t>& from,
                    const std::vector<int64_t>& n) {
    const int64_t rows = std::max<int64_t>(1, *std::max_element(n.begin(), n.end()));
    Owned4 out(B, rows, heads, d, dc.dtype, L);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n[size_t(b)]; ++i)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < d; ++c) {
            int64_t idx[4] = {b, i, h, c};
            if (L == Layout::BHSD) std::swap(idx[1], idx[2]);
            out.view.set(idx, (seqs[size_t(b)].*field).at(0, from[size_t(b)] + i, h, c, L));
          }
    return out;
  };
  const double tol = dc.dtype == DType::bf16 ? 1e-2 : 2e-5;
  double max_err = 0, max_lse_err = 0;
  int checked = 0;
  auto check = [&] {  // one decode query per sequence: the last token's row of the full forward
    std::vector<int64_t> pos(static_cast<size_t>(B)), one(static_cast<size_t>(B), 1);
    for (int64_t b = 0; b < B; ++b) pos[size_t(b)] = cache.length(b) - 1;
    Owned4 q = gather(&Seq::q, Hq, D, pos, one);
    Owned4 o(B, 1, Hq, Dv, dc.dtype, L);
    std::vector<float> lse(size_t(B * Hq));
    cache.attend(q.view, o.view, TensorView(lse.data(), DType::f32, {B, Hq, 1}));
    for (int64_t b = 0; b < B; ++b) {
      const Seq& s = seqs[size_t(b)];
      const int64_t t = pos[size_t(b)];
      double err = 0, mx = 1e-6;
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t c = 0; c < Dv; ++c) {
          const double want = s.o.at(0, t, h, c, L);
          err = std::max(err, std::fabs(o.at(b, 0, h, c, L) - want));
          mx = std::max(mx, std::fabs(want));
        }
        const double lw = s.lse[size_t(h * total[size_t(b)] + t)];
        max_lse_err = std::max(max_lse_err, std::fabs(lse[size_t(b * Hq + h)] - lw) / std::max(1.0, std::fabs(lw)));
      }
      max_err = std::max(max_err, err / mx);
      ++checked;
    }
  };
  std::vector<int64_t> zero(static_cast<size_t>(B), 0);
  {  // prefill
    Owned4 k = gather(&Seq::k, Hkv, D, zero, prompt), v = gather(&Seq::v, Hkv, Dv, zero, prompt);
    cache.append(k.view, v.view, prompt.data());
    check();
  }
  for (;;) {  // one token at a time; finished sequences append nothing
    std::vector<int64_t> from(static_cast<size_t>(B)), n(static_cast<size_t>(B));
    bool any = false;
    for (int64_t b = 0; b < B; ++b) {
      from[size_t(b)] = cache.length(b);
      n[size_t(b)] = cache.length(b) < total[size_t(b)] ? 1 : 0;
      any |= n[size_t(b)] > 0;
      if (seg && !dc.listed && n[size_t(b)] > 0) {
        const auto& st = dc.segments[size_t(b)];
        if (std::find(st.begin(), st.end(), cache.length(b)) != st.end()) cache.begin_segment(b);
      }
    }
    if (!any) break;
    Owned4 k = gather(&Seq::k, Hkv, D, from, n), v = gather(&Seq::v, Hkv, Dv, from, n);
    cache.append(k.view, v.view, n.data());
    check();
  }
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(cache.length(b), total[size_t(b)]);
  int64_t steps = 0;
  for (int64_t b = 0; b < B; ++b) steps = std::max(steps, total[size_t(b)] - prompt[size_t(b)]);
  EXPECT_EQ(checked, B * (1 + steps));  // every row after the prompt was compared
  EXPECT_LE(max_err, tol);
  EXPECT_LE(max_lse_err, 1e-5);
}

MlrOptions base_options() {
  MlrOptions o = mlr_options({8, 4, 2, 2});
  o.context = 64;  // blocks 64, 32, 16, 8
  return o;
}

TEST(MlrKvCache, DecodeEqualsFullForwardAcrossBlockTransitions) {
  std::vector<DecodeCase> cases;
  cases.push_back({"default scales", base_options()});
  DecodeCase c{"level average, divide by L, BHSD", base_options()};
  c.opt.level_average = true;
  c.opt.divide_by_num_levels = true;
  c.opt.layout = Layout::BHSD;
  cases.push_back(c);
  c = {"mask across top-level blocks, sqrt scale", base_options()};
  c.opt.mask_cross_segment = true;
  c.opt.scale = MlrScale::inv_sqrt_head_dim;
  cases.push_back(c);
  c = {"explicit blocks, bf16", base_options()};
  c.opt.context = 0;
  c.opt.block_sizes[0] = 48;
  c.opt.block_sizes[1] = 24;
  c.opt.block_sizes[2] = 6;
  c.opt.block_sizes[3] = 3;
  c.dtype = DType::bf16;
  cases.push_back(c);
  for (const DecodeCase& dc : cases) run_decode(dc, {150, 97, 40}, {5, 33, 1}, 160);
}

TEST(MlrKvCache, DecodeWithSegmentsEqualsForwardWithSegmentLists) {
  // Per-sequence segment lists (packed documents): level 1 = the current segment, finer levels
  // restart at its start; every decoded row equals that sequence's forward with its own list.
  std::vector<DecodeCase> cases;
  DecodeCase c{"listed segments", base_options()};
  c.segments = {{3, 40, 41, 100}, {}, {20}};
  cases.push_back(c);
  c.name = "listed segments, mask across segments, level average";
  c.opt.mask_cross_segment = true;
  c.opt.level_average = true;
  cases.push_back(c);
  c = {"begin_segment while decoding", base_options()};
  c.segments = {{60, 61, 130}, {50}, {}};
  c.listed = false;
  cases.push_back(c);
  c = {"segments, explicit finer blocks, bf16, BHSD", base_options()};
  c.opt.context = 0;
  c.opt.block_sizes[1] = 24;
  c.opt.block_sizes[2] = 6;
  c.opt.block_sizes[3] = 3;
  c.opt.layout = Layout::BHSD;
  c.dtype = DType::bf16;
  c.segments = {{7, 77}, {33}, {2, 4, 6}};
  cases.push_back(c);
  for (const DecodeCase& dc : cases) run_decode(dc, {150, 97, 40}, {5, 33, 1}, 160);
}

TEST(MlrKvCache, NonCausalOptionsDecodeAsTheLastRow) {
  // The last query sees only earlier keys either way: run_decode compares against the full
  // forward's rows, which for causal = false differ except the last; so compare at full length
  // through a batch whose sequences end at each length (prompt = total - 1).
  DecodeCase c{"non-causal", base_options()};
  c.opt.causal = false;
  std::vector<int64_t> total, prompt;
  for (int64_t T : {1, 2, 9, 64, 65, 97}) {
    total.push_back(T);
    prompt.push_back(T);
  }
  run_decode(c, total, prompt, 100);
}

TEST(MlrKvCache, NonNestedBlocksDecodeAsTheForward) {
  // Block lists that are not nested (each level on its own): the starts of the levels' current
  // blocks come in any order, and the level count of a key is read off their sorted order.
  DecodeCase c{"non-nested 48|20|32|6", base_options()};
  c.opt.context = 0;
  c.opt.block_sizes[0] = 48;
  c.opt.block_sizes[1] = 20;
  c.opt.block_sizes[2] = 32;
  c.opt.block_sizes[3] = 6;
  c.opt.level_average = true;
  run_decode(c, {150, 97, 40}, {5, 33, 1}, 160);
  c.name = "non-nested, mask across, segments";
  c.opt.mask_cross_segment = true;
  c.segments = {{3, 40, 100}, {}, {20}};
  run_decode(c, {150, 97, 40}, {5, 33, 1}, 160);
}

// Attend after n tokens vs the last row of mlr_attention_forward over exactly those n tokens,
// same options, for every n <= max_seqlen (not only rows of one forward over the whole sequence).
void expect_decode_equals_prefix_forward(const MlrOptions& opt, int64_t max_seqlen) {
  const int64_t H = 2, Dv = 8;
  int64_t D = 0;
  for (int l = 0; l < opt.num_levels; ++l) D += opt.ranks[l];
  std::mt19937 rng(23);
  Owned4 q(1, max_seqlen, H, D, DType::f32, Layout::BSHD), k = q, v(1, max_seqlen, H, Dv, DType::f32, Layout::BSHD);
  k.view.data = k.buf.data();
  q.fill_random(rng, -2, 2);
  k.fill_random(rng, -2, 2);
  v.fill_random(rng);
  MlrKvCache cache(1, H, Dv, max_seqlen, opt);
  for (int64_t n = 1; n <= max_seqlen; ++n) {
    auto rows = [](const Owned4& t, int64_t from, int64_t count) {  // a view of rows [from, from + count)
      TensorView x = t.view;
      x.data = static_cast<float*>(x.data) + from * x.stride[1];
      x.shape[1] = count;
      return x;
    };
    const int64_t one = 1;
    cache.append(rows(k, n - 1, 1), rows(v, n - 1, 1), &one);
    std::vector<float> od(static_cast<size_t>(H * Dv)), ld(static_cast<size_t>(H));
    cache.attend(rows(q, n - 1, 1), TensorView(od.data(), DType::f32, {1, 1, H, Dv}),
                 TensorView(ld.data(), DType::f32, {1, H, 1}));
    Owned4 of(1, n, H, Dv, DType::f32, Layout::BSHD);
    std::vector<float> lf(size_t(H * n));
    mlr_attention_forward(rows(q, 0, n), rows(k, 0, n), rows(v, 0, n), of.view,
                          TensorView(lf.data(), DType::f32, {1, H, n}), opt);
    double err = 0, mx = 1e-6;
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < Dv; ++c) {
        const double want = of.at(0, n - 1, h, c, Layout::BSHD);
        err = std::max(err, std::fabs(od[size_t(h * Dv + c)] - want));
        mx = std::max(mx, std::fabs(want));
      }
      EXPECT_NEAR(ld[size_t(h)], lf[size_t(h * n + n - 1)], 1e-5 * std::max(1.f, std::fabs(lf[size_t(h * n + n - 1)])))
          << "n = " << n;
    }
    EXPECT_LE(err / mx, 2e-5) << "n = " << n;
  }
}

TEST(MlrKvCache, DecodeEqualsTheForwardOverThePrefixAtEveryLength) {
  MlrOptions o = base_options();  // context 64: blocks 64/32/16/8; 100 tokens cross the context
  expect_decode_equals_prefix_forward(o, 100);
  o.level_average = true;
  o.mask_cross_segment = true;
  expect_decode_equals_prefix_forward(o, 100);
  MlrOptions nn = mlr_options({6, 5, 5});  // not nested
  nn.block_sizes[0] = 64;
  nn.block_sizes[1] = 16;
  nn.block_sizes[2] = 24;
  nn.level_average = true;
  expect_decode_equals_prefix_forward(nn, 90);
}

TEST(MlrKvCache, RequiresTheModelsBlocks) {
  // With the forward's default (context 0: blocks from each call's length) the n tokens held
  // would have a different geometry at every n: the cache asks for the model's context instead.
  try {
    MlrKvCache c(1, 1, 4, 100, mlr_options({8, 4, 2, 2}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'opt.context'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("context length"), std::string::npos) << e.what();
  }
  // One level: one block holding every position whatever its size (dense), nothing to fix.
  EXPECT_NO_THROW(MlrKvCache(1, 1, 4, 100, mlr_options({16})));
  MlrOptions blocks = mlr_options({8, 8});
  blocks.block_sizes[0] = 32;
  blocks.block_sizes[1] = 8;
  EXPECT_NO_THROW(MlrKvCache(1, 1, 4, 100, blocks));
}

TEST(MlrKvCache, MemoryKeepsOnlyTheCurrentBlocks) {
  // 8 levels of 8, dyadic over a 4096 context: keys 4096 * 15.94 per head instead of 4096 * 64.
  MlrOptions o = mlr_options({8, 8, 8, 8, 8, 8, 8, 8});
  const int64_t B = 2, Hkv = 3, Dv = 64, T = 4096;
  o.context = T;
  MlrKvCache cache(B, Hkv, Dv, T, o);
  int64_t per_head = 0;
  for (int l = 0; l < 8; ++l) per_head += (T >> l) * 8;
  EXPECT_EQ(cache.key_bytes(), B * Hkv * per_head * 4);
  EXPECT_EQ(cache.value_bytes(), B * Hkv * T * Dv * 4);
  EXPECT_EQ(cache.dense_key_bytes(), B * Hkv * T * 64 * 4);
  EXPECT_NEAR(double(cache.dense_key_bytes()) / double(cache.key_bytes()), 64 / 15.9375, 1e-12);
  EXPECT_EQ(cache.memory_bytes(), cache.key_bytes() + cache.value_bytes());
  // blocks larger than the cache are capped at max_seqlen slots
  o.context = 128;
  MlrKvCache small(1, 1, 4, 10, o);
  EXPECT_EQ(small.key_bytes(), (10 + 10 + 10 + 10 + 8 + 4 + 2 + 1) * 8 * 4);  // blocks 128..1, capped at 10
}

TEST(MlrKvCache, BadInput) {
  MlrOptions o = mlr_options({4, 4});
  o.context = 16;
  using test::expect_error;
  const int64_t segs[] = {4, 2}, offs[] = {0, 2};
  MlrOptions seg = o;
  seg.segment_starts = segs;
  seg.num_segment_starts = 2;
  expect_error([&] { MlrKvCache c(1, 1, 4, 16, seg); }, {"'segment_starts[1]'", "increasing"});
  seg.segment_offsets = offs;
  seg.num_segment_offsets = 2;
  expect_error([&] { MlrKvCache c(1, 1, 4, 16, seg); }, {"'segment_starts[1]'", "increasing"});
  expect_error([&] { MlrKvCache(1, 1, 4, 16, o).begin_segment(0); }, {"'this cache'", "segment mode"});
  MlrOptions zero = mlr_options({4, 0});
  expect_error([&] { MlrKvCache c(1, 1, 4, 16, zero); }, {"'ranks[1]'"});

  MlrKvCache cache(2, 1, 4, 16, o);
  std::vector<float> buf(2 * 20 * 8, 0.25f);
  TensorView k(buf.data(), DType::f32, {2, 10, 1, 8}), v(buf.data(), DType::f32, {2, 10, 1, 4});
  const int64_t n_ok[] = {10, 3}, n_big[] = {10, 7};
  cache.append(k, v, n_ok);
  expect_error([&] { cache.append(k, v, n_big); }, {"'n_new[0]'", "at most 6", "got 10"});
  TensorView k_bad(buf.data(), DType::f32, {2, 10, 1, 7});
  expect_error([&] { cache.append(k_bad, v, n_ok); }, {"'k'", "dim=8", "dim=7"});
  std::vector<float> qb(2 * 3 * 8), ob(2 * 3 * 4), lse(6);
  TensorView q(qb.data(), DType::f32, {2, 1, 3, 8}), out(ob.data(), DType::f32, {2, 1, 3, 4});
  EXPECT_NO_THROW(cache.attend(q, out, TensorView(lse.data(), DType::f32, {2, 3, 1})));
  TensorView q2(qb.data(), DType::f32, {2, 2, 3, 8});
  expect_error([&] { cache.attend(q2, out, TensorView(lse.data(), DType::f32, {2, 3, 1})); },
               {"'q'", "seq=1", "seq=2"});
  // o and lse through the checks every family shares (strata/checks.h): one row per sequence
  TensorView out_bad(ob.data(), DType::f32, {2, 1, 3, 3});
  expect_error([&] { cache.attend(q, out_bad, TensorView(lse.data(), DType::f32, {2, 3, 1})); },
               {"MlrKvCache::attend: argument 'o'", "dim=4", "dim=3"});
  expect_error([&] { cache.attend(q, out, TensorView(lse.data(), DType::f32, {2, 3, 2})); },
               {"MlrKvCache::attend: argument 'lse'", "[2, 3, 1]", "[2, 3, 2]"});
}

}  // namespace
}  // namespace strata
