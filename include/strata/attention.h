// strata/attention.h: dense softmax attention on the CPU, flash-style (tiled, online softmax,
// never an Nq x Nk buffer), forward and backward, plus the masks every baseline needs.
//
//   O = softmax(scale * Q K^T + bias + mask) V         per (batch, head h of the output)
//   lse[b, h, i] = log sum_j exp(scale * q_i . k_j + bias_ij)   over allowed keys j (natural log)
//
// Shapes (layout BSHD; with Layout::BHSD dims 1 and 2 are swapped, any strides):
//   q    batch x seqlen_q x heads_q  x head_dim
//   k    batch x seqlen_k x heads_kv x head_dim        one of heads_q, heads_kv divides the other
//   v    batch x seqlen_k x heads_kv x head_dim_v
//   o    batch x seqlen_q x H        x head_dim_v      H = max(heads_q, heads_kv); dtype of q
//   lse  batch x H        x seqlen_q                   float32, any strides
// Heads: output head h attends with query head h / (H / heads_q) and kv head h / (H / heads_kv):
//   heads_q % heads_kv == 0   GQA / MQA: H = heads_q, each kv head serves heads_q / heads_kv
//                             query heads (read once, never copied);
//   heads_kv % heads_q == 0   shared query, its mirror: H = heads_kv, each query head serves
//                             heads_kv / heads_q kv heads (heads_q = 1: one query for every head,
//                             as Bilinear BTT attention's raw block input). The forward reads that
//                             query for each of its heads (no copy); the backward's dq has q's
//                             shape, the sum of its heads' contributions, summed in the kernel.
// Anything else throws strata::Error naming 'k'. head_dim and head_dim_v are any sizes >= 1 (tested
// up to 1024, e.g. Bilinear BTT's model width; workspaces grow linearly in them).
// q, k, v, o (and the gradients) are float32 or bfloat16, all the same dtype; the softmax, its
// statistics (max, sum, lse) and every accumulation are fp32. The products Q K^T and P V of a
// bfloat16 forward run in bf16 on AMX-BF16, or AVX512-BF16 where it outruns fp32 (AttentionOptions::compute,
// strata/cpu.h; attention_compute says which): Q K^T of the bf16 inputs is exact in fp32 before
// the accumulation; P = exp(s - m) is rounded to bf16 (relative 2^-9) for P V, as FlashAttention
// does on GPUs, while its row sums stay fp32. The backward runs all five products on the same
// engine: Q K^T and dO V^T of the bf16 inputs (only the summation order changes), P^T dO, dS^T Q
// and dS K with P and dS rounded to bf16 (relative 2^-9), as FlashAttention does on GPUs;
// compute = fp32 keeps them all fp32. fp32 products for float32 inputs and for calls of at most 4
// queries (decoding).
// Inputs may alias and have stride-0 dims (e.g. torch's expand); outputs (o, lse, dq, dk, dv)
// must not overlap themselves (strata::Error naming the argument, after the other checks).
//
// Mask (all options combine; key j is allowed for query i when every condition holds):
//   off = seqlen_k - seqlen_q, p = i + off   (bottom-right alignment, as FlashAttention)
//   causal:            j <= p
//   window (l, r):     p - l <= j <= p + r           (-1 = unbounded on that side)
//   num_global = G:    Longformer-style global tokens: if j < G or p < G the window test is
//                      waived (one softmax over window + globals); causal still applies
//   key_padding_mask:  mask[b, j] != 0               (uint8, batch x seqlen_k)
//   bias:              added to the logits           (broadcastable to batch x H x seqlen_q
//                                                     x seqlen_k via stride 0; f32 or q's dtype)
// A query row with no allowed key outputs zeros, lse = -inf, and gets zero gradients (documented
// choice; PyTorch's SDPA returns NaN there).
//
// Non-finite inputs (IEEE semantics, no error): a NaN or Inf reaches every output that reads it;
// one in q row i reaches no other row's o, lse or dq; none crosses to another batch or kv head
// (nor, with a shared query, to another query head).
// Within a head it may also reach outputs of pairs whose mask excludes it, since masked
// probabilities enter the P V and dS products as exact zeros (0 * Inf = NaN; so does SDPA).
//
// Finite inputs give finite outputs within these bounds (FLT_MAX = 3.4e38; per allowed pair i, j):
//   forward   log2(e) * (scale * sum_d |q_id k_jd| + |bias_ij|) < FLT_MAX   (the base-2 logit and
//             its partial sums), and 2^8 * seqlen_k * max |v| < FLT_MAX (the unnormalised O;
//             the output itself is at most max |v|);
//   backward  that sum < 2^26 instead (|logit| < 4.6e7): it recomputes P = exp(s - lse) in fp32,
//             and the rounding of lse (a few ulps of |lse|) lets P exceed 1 (up to 2^12 at the
//             bound) and overflow near |lse| ~ 4e8; gradient error grows about like 1e-7 |lse|.
//             And the gradient sums: 2^13 * seqlen_q * (2 * scale * G * max |q, k| + max |dout|)
//             < FLT_MAX, G = max_i ||dout_i|| * max_j ||v_j||.
// Beyond: a strata::Error naming 'q' (or 'dout' for the gradient sums), never a silent NaN. The
// calls check what they wrote: the forward one pass over lse (a logit past fp32's range makes its
// row's lse NaN or infinite), the backward one over dq, dk, dv (1 / (3 seq) of its FLOPs); only when
// an output is not finite do they read q, k (and the rest) again, and raise when those are finite
// and past the bound's sufficient form |scale| max_i ||q_i|| max_j ||k_j|| + max |bias| (an lse of
// -inf within it is a row with no allowed key). Non-finite inputs keep the IEEE rule above. Tests:
// tests/cpp/core_nonfinite_test.cpp.
//
// Cost: 4 * B * H * Nq * Nk * D FLOPs forward (half that for causal), ~2.5x that backward.
// With a left window (window_left >= 0) and no global tokens only the keys some query can reach
// (the last Nq + window_left) are read: time and workspace follow the window, not Nk (the
// backward still writes zeros to dk, dv of the others).
// Limit: with a causal, window or global mask the keys in reach must number < 2^24 (the forward
// kernel compares positions in fp32); more throw strata::Error naming 'k'.
// Threads: parallel over (batch, output head, query tile) forward and over (batch, kv head, range of
// key tiles) backward, every sum in an order fixed by the shapes and the thread count: repeated
// calls give the same bits (src/core/key_splits.inc).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "strata/checks.h"
#include "strata/cpu.h"
#include "strata/tensor.h"

namespace strata {

struct AttentionOptions {
  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1;   // -1: unbounded
  int64_t window_right = -1;  // -1: unbounded
  int64_t num_global = 0;     // first G key positions are global tokens (see above)
  Layout layout = Layout::BSHD;
  TensorView key_padding_mask;  // optional: batch x seqlen_k, uint8, nonzero = attend
  TensorView bias;              // optional: 4-D, broadcastable to batch x H x seqlen_q x seqlen_k
  Compute compute = Compute::automatic;  // products of bf16 inputs (strata/cpu.h; see above)
};

// Throws strata::Error naming the option unless opt fits a call of sizes d (strata/checks.h):
// scale finite (or NaN), windows >= -1, num_global >= 0, key_padding_mask [batch, seq_k] uint8,
// bias broadcastable to [batch, d.heads(), seq_q, seq_k] of float32 or q's dtype.
void validate(const char* where, const AttentionOptions& opt, const AttnDims& d);

// The window bound w (window_left or window_right, >= -1) as the kernels take it: -1 when w
// reaches every key of a seqlen_q x seqlen_k call (w >= seqlen_q + seqlen_k: every |p - j| is
// below that), else w. A user may pass any int64 (2^63 - 1 for "no bound"): the kernels add w to
// positions, which would overflow int64 past this point.
int64_t effective_window(int64_t w, int64_t seqlen_q, int64_t seqlen_k);

// FLOPs of one call under the project's convention (FlashAttention's; docs/methods.md):
// forward 2 * batch * H * seqlen_q * seqlen_k * (head_dim + head_dim_v) (QK^T and P V), H = d.heads(),
// halved when causal (masks other than causal are not discounted); backward kBackwardFlops times
// the forward.
struct AttentionFlops {
  static constexpr double kBackwardFlops = 2.5;
  double forward = 0, backward = 0;
};
AttentionFlops attention_flops(const AttnDims& d, bool causal);

// The engine attention_forward runs the products of a call of sizes d (and d.dtype) with opt on
// this CPU and active ISA: fp32, avx512_bf16 or amx_bf16 (the file comment says when). Throws
// strata::Error naming 'compute' as the forward would.
Compute attention_compute(const AttnDims& d, const AttentionOptions& opt);

// Forward: writes o and lse.
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const TensorView& lse, const AttentionOptions& opt);

// Backward: given dout (shape and dtype of o) and the forward's o and lse, writes dq, dk, dv
// (shapes and dtype of q, k, v). Recomputes the probabilities from lse; no Nq x Nk buffer.
// The bias is treated as a constant (no gradient).
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& lse, const TensorView& dout,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& opt);

// --- The structured-attention paper's global + sliding-window baseline ("GSWA"), a composition.
// Head dims of q and k are split a | b (a = split_a, b = head_dim - a): a causal softmax over the
// a dims with logits scale_a * q_a . k_a and a causal sliding-window softmax (window keys
// p-window..p) over the b dims with logits scale_b * q_b . k_b; the two PROBABILITY matrices are
// ADDED without renormalising (rows sum to 2):  O = P_a V + P_b V.
// Scales: each branch has its own. Defaults (NaN) are the reference code's
// (CausalSelfGlobalSlidingWindowAttention): scale_a = 8/a, scale_b = 8/b, the muP-style 8/d
// logit scale of standard MHA in that code applied per branch; a given scale overrides its
// branch's default.
// This is NOT the Longformer form (use AttentionOptions::num_global for that).
// o_a and o_b (shape of o, same dtype) receive the two branches (the backward needs them);
// lse_a / lse_b as for attention_forward.
struct PaperGswaOptions {
  int64_t split_a = 0;  // a: number of head dims in the global (causal) branch, 1..head_dim-1
  int64_t window = 0;   // w: keys p-w..p in the windowed branch
  float scale_a = std::numeric_limits<float>::quiet_NaN();  // NaN: 8 / a
  float scale_b = std::numeric_limits<float>::quiet_NaN();  // NaN: 8 / b, b = head_dim - a
  Layout layout = Layout::BSHD;
};
void paper_gswa_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& o_a, const TensorView& o_b,
                        const TensorView& lse_a, const TensorView& lse_b,
                        const PaperGswaOptions& opt);
void paper_gswa_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& o_a, const TensorView& o_b, const TensorView& lse_a,
                         const TensorView& lse_b, const TensorView& dout, const TensorView& dq,
                         const TensorView& dk, const TensorView& dv, const PaperGswaOptions& opt);

// --- Naive double-precision references (materialise Nq x Nk; for tests and benchmarks only).
// Same arguments and semantics as the kernels; outputs are double, contiguous, in the BSHD order:
//   o: B*Nq*H*Dv, lse: B*H*Nq, dq: B*Nq*Hq*D, dk: B*Nk*Hkv*D, dv: B*Nk*Hkv*Dv (H = max(Hq, Hkv)).
namespace reference {
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttentionOptions& opt, double* o, double* lse);
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& dout, const AttentionOptions& opt, double* dq,
                        double* dk, double* dv);
}  // namespace reference

}  // namespace strata
