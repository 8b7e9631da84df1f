// strata/monarch.h: MonarchAttention (Yaras et al., NeurIPS 2025, arXiv 2505.18698) on the CPU,
// forward and backward. A zero-shot, sub-quadratic approximation of softmax attention:
//
//   O ~ softmax(scale * Q K^T) V    with the attention matrix constrained to a Monarch matrix
//   A[(l,j),(k,i)] = L_j[l,k] * R_k[j,i]      query token l*B+j, key token k*B+i
//
// found by T steps of alternating maximisation of the variational form of softmax,
// f(A) = <A, scale * Q K^T> + H(A) over row-stochastic A (docs/methods.md).
// Never builds an N x N buffer. Per (batch, query head), with B the block size, M = ceil(N/B)
// blocks, tokens zero-padded to M*B, sc = scale:
//
//   init   a[k,j] = q_{k*B+j}, c[k,j] = 1                  (L = identity)
//   R-step R_k[j,:] = softmax_i( sc * a[k,j].k_{k*B+i} / c[k,j] )         over block k's keys
//          al[j,k] = sc * sum_i R_k[j,i] k_{k*B+i},  cl[j,k] = sum_i R_k[j,i] log R_k[j,i]
//   L-step L_j[l,:] = softmax_k( q_{l*B+j}.al[j,k] - cl[j,k] )           over the M blocks
//          c[k,j] = sum_l w_{l*B+j} L_j[l,k],  a[k,j] = sum_l w L_j[l,k] q_{l*B+j}
//   steps  T-1 times {R-step, L-step}, then an R-step that also forms y[j,k] = sum_i R v_i and
//          an L-step that outputs O_{l*B+j} = sum_k L_j[l,k] y[j,k].
//   w_p = 1 for a real, unmasked token p, 0 for padding and key_padding_mask == 0.
// T = 1 is exact softmax attention inside each block followed by one softmax across the blocks.
// B = 1 and B >= N are both EXACT softmax attention for every T (without a mask in both modes;
// with a mask in stable mode, on the valid queries). block_size > seqlen means one block.
//
// Shapes (layout BSHD; with Layout::BHSD dims 1 and 2 are swapped; any strides):
//   q      batch x seqlen x heads_q  x head_dim
//   k      batch x seqlen x heads_kv x head_dim      heads_q % heads_kv == 0 (GQA / MQA, no copy)
//   v      batch x seqlen x heads_kv x head_dim_v    (head_dim_v may differ from head_dim)
//   o      batch x seqlen x heads_q  x head_dim_v    same dtype as q
//   state  batch x heads_q x (T-1) x (M*B) x head_dim   float32, any strides, OPTIONAL
//   key_padding_mask  batch x seqlen, uint8, nonzero = token kept (as key AND as query)
// q, k, v, o, dout, dq, dk, dv: float32 or bfloat16, all one dtype. Every internal value is fp32
// (bf16 is read once and rounded once at the output); ma_torch.py instead keeps a/al/y in the
// input dtype, which we do not reproduce. Self-attention only: q and k have the same seqlen.
//
// Modes (MonarchMode):
//   reference  reproduces ma_torch.py's arithmetic (formulas, order of masking, eps = 1e-12):
//              R = exp(s - max(rowmax, eps)) / (sum + eps) with s = sc*a.k/(c + eps), so a row
//              of very negative logits underflows to R = 0; fully masked key blocks keep L
//              weight (their logit is 0 - 0); masked (non-pad) queries feed the first R-step
//              (a = q for every token) and get an output row. Use it to compare accuracy
//              numbers with the paper.
//   stable     (default) true maxima, no eps; a key block with no valid key gets R = 0 and is
//              excluded from every L softmax; masked queries are excluded from a and c from the
//              first step on and output zeros (zero gradients); where c[k,j] = 0 (no valid query
//              at offset j) the R row is uniform over the block's valid keys; a query with no
//              valid key anywhere outputs zeros.
// Both modes: NaN / Inf in the inputs propagate (IEEE), no error. Finite inputs give finite
// outputs when log2(e) * (scale * max_n ||q_n|| * max_m ||k_m|| + ln B) < FLT_MAX (2-norms; every
// R-step input a / c is a weighted mean of queries, every softmax subtracts its max, and R and L
// rows sum to at most 1, so no other value grows; the backward measured finite at half the bound).
// Beyond: a strata::Error naming 'q' (or 'dout'), as attention.h's: the calls check what they
// wrote (one pass over o, or dq, dk, dv) and, only when it is not finite while the inputs are, read
// q and k again against that bound (a logit that overflowed to +inf had made its R row NaN, and
// through al / cl every query of that offset, with no error). Tests: tests/cpp/core_nonfinite_test.cpp.
//
// bf16 products (opt in): with compute = avx512_bf16 or amx_bf16 a bfloat16 forward runs its six
// products on that bf16 engine (bf16 operands, fp32 accumulation, as attention.h's), and the
// backward its gradient products. compute = auto keeps fp32 products for Monarch: the forward's
// bf16 path is correct but not faster (its operands go through fp32 copies, the logits' operands
// enter as two bf16 parts, and the small products do not hide the packing); the backward's bf16
// products pay at longer sequences on some CPUs but stay opt in with the forward's. Their speed
// against fp32 compute: docs/results.md (MonarchAttention); why: docs/notes.md.
// Forward: products of the inputs read them exactly (S = q k^T at step 1, the keys, values and
// queries of every product); y = R v and o = L y read R, L and y rounded to bf16, as attention.h
// rounds P. The operands that feed a logit, R and al (for the L logits q . al - cl), w L and abar
// (for the next step's R logits), enter their products as two bf16 parts, hi + lo (x - hi - lo ~
// 2^-17 x): one rounding there moved logits by 2^-9 of their scale and the gradients through the
// saved state by 2% (T = 3, peaky softmaxes). Softmaxes, their statistics (cl) and every sum stay
// fp32. Backward: the recomputed products that give R and L (S = A k^T, U = al q^T, and the R-step's
// al and y) stay fp32, so R and L are those of fp32 compute; the gradient products (ten at the last step:
// dL = y G^T, dy = L G, dq += du^T al (+ P^T dabar), dal = du q, dP = (sc dal) k^T + dy v^T,
// dabar = ds' K, dk += ds'^T A + R^T (sc dal), dv += R^T dy) read their fp32 intermediates rounded
// to bf16 once, as FlashAttention rounds P and dS: the gradients' error against the double
// reference, worst over the core sweep, 8.3e-3 (3.7e-3 with fp32 products; the tests hold both to
// 2e-2, as attention's bf16 gradients). compute = fp32 keeps every product fp32.
//
// Padding: N not a multiple of B is zero-padded to M*B tokens, at the end (MonarchPad::post) or at
// the front (MonarchPad::pre: ViT with B = 14, N = 197 puts CLS + padding in block 0). Padded
// tokens are never valid keys and never valid queries; the output is sliced back to N.
//
// Saved state: the input a/c of every R-step after the first, normalised (abar = a / c, or
// a / (c + eps) in reference mode, 0 where c = 0): state[b, h, s, p, :] = abar of step s + 2 at
// padded position p = k*B + j (s = 0..T-2). The forward writes it when `state` is given; the
// backward reads it when given (it must come from a forward with the same inputs and options),
// else recomputes it (cost: T-1 extra forward steps). Memory: (T-1) * M*B * head_dim floats per
// (batch, query head), i.e. (T-1) fp32 copies of q; nothing for T = 1.
//
// Cost (multiply-accumulates, the paper's FLOP count / 2):
//   forward   N * D * [T * (2B + 2M) + B] per (batch, query head)   (D = Dv)
//   backward  a few times the forward (no saved state): every step's R and L are recomputed, not
//             stored (times: docs/results.md).
// Memory: never an N x N buffer, for any B. Per (batch, head) in flight about (2 + [T > 1]) * N*D
// floats (forward) or (6 + T) * N*D (backward; D ~ Dv, padded to 16), plus per-thread tiles of
// O((B + M) * D + 64 B + 128 M) floats, all in a grow-only workspace of the calling thread.
// Threads: parallel over (batch, head) units (backward: (batch, kv head) groups), or over the
// blocks / offsets of one head at a time when the units do not share evenly among the threads.
// Results do not depend on the thread count (bitwise).
//
// Backward: exact gradients through all T alternating-maximisation steps (derivation in
// src/cpu/kernels/monarch.inc); the one term dropped is reference mode's derivative of the
// max(rowmax, eps) shift, which is eps/(sum + eps) <= 1e-12 relative. Entries with R = 0 (masked
// or padded keys, underflow) get zero gradient: R (log R + 1) -> 0. (Torch autograd through
// ma_torch.py returns NaN dq, dk as soon as one key is padded or masked: xlogy's backward at 0.)
#pragma once
#include <cstdint>
#include <limits>

#include "strata/checks.h"
#include "strata/cpu.h"  // Compute
#include "strata/tensor.h"

namespace strata {

enum class MonarchMode : uint8_t { stable = 0, reference = 1 };
enum class MonarchPad : uint8_t { post = 0, pre = 1 };

// The names the specs, the op schema and Python use: "stable" / "reference", "post" / "pre".
inline const char* monarch_mode_name(MonarchMode mode) { return mode == MonarchMode::reference ? "reference" : "stable"; }
inline const char* monarch_pad_name(MonarchPad pad) { return pad == MonarchPad::pre ? "pre" : "post"; }

struct MonarchOptions {
  int64_t num_steps = 1;    // T >= 1
  int64_t block_size = 0;   // B >= 1; 0: floor(sqrt(seqlen)) (the paper's benchmarks)
  MonarchPad pad = MonarchPad::post;
  MonarchMode mode = MonarchMode::stable;
  Layout layout = Layout::BSHD;
  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: 1 / sqrt(head_dim)
  TensorView key_padding_mask;  // optional: batch x seqlen, uint8, nonzero = keep
  Compute compute = Compute::automatic;  // products of a bf16 forward / backward (strata/cpu.h; see above)
};

// Block geometry for a sequence length (after the block_size default is applied).
struct MonarchGeometry {
  int64_t block_size = 0;  // B
  int64_t num_blocks = 0;  // M = ceil(N / B)
  int64_t padded_len = 0;  // M * B
  int64_t pad_front = 0;   // padded positions before token 0 (pre: M*B - N, post: 0)
};
// Throws strata::Error for seqlen < 0 or block_size < 0.
MonarchGeometry monarch_geometry(int64_t seqlen, const MonarchOptions& opt);

// Throws strata::Error naming the option unless opt fits a call of sizes d (strata/checks.h):
// self-attention (seq_k = seq_q), num_steps >= 1, mode, pad, scale, block_size >= 0, key padding.
void validate(const char* where, const MonarchOptions& opt, const AttnDims& d);

// FLOPs (2 x multiply-accumulates, matmuls only: the paper's count) of one forward: per (batch,
// query head), over the padded length P = M*B, P * (D * ((T-1)(2B + 2M) + 2B + M) + Dv * (B + M))
// MACs, which is the paper's N * D * [T (2B + 2M) + B] when Dv = D and N = P. N = 0 gives 0.
double monarch_attention_flops(const AttnDims& d, const MonarchOptions& opt);

// The engine a forward or backward of sizes d with opt runs its products on (strata/cpu.h): fp32,
// or the avx512_bf16 / amx_bf16 engine opt.compute names for bf16 inputs (auto: fp32; see the file
// comment). Throws strata::Error naming 'compute' when opt.compute asks for an engine this CPU (or
// the active ISA) does not have.
Compute monarch_attention_compute(const AttnDims& d, const MonarchOptions& opt);

// Forward: writes o, and state when it is defined (pass TensorView{} to skip it).
void monarch_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& o, const TensorView& state,
                               const MonarchOptions& opt);

// Backward: given dout (shape and dtype of o), writes dq, dk, dv (shapes and dtype of q, k, v).
// state: the forward's saved state, or TensorView{} to recompute it.
void monarch_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& state, const TensorView& dout,
                                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                const MonarchOptions& opt);

// --- Double-precision reference (materialises the N x N Monarch matrix; tests only).
// Reads q, k, v, dout of any dtype, float64 included (for finite differences). Outputs are double,
// contiguous, in the BSHD order: o: B*N*Hq*Dv, dq: B*N*Hq*D, dk: B*N*Hkv*D, dv: B*N*Hkv*Dv.
namespace reference {
void monarch_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const MonarchOptions& opt, double* o);
void monarch_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& dout, const MonarchOptions& opt, double* dq,
                                double* dk, double* dv);
// The variational objective f(A) = sum over valid query rows n of
// sum over valid keys m of (A_nm * scale * q_n.k_m - A_nm log A_nm), evaluated after every half
// step: f[((b * Hq + h) * T + t) * 2 + 0] after the R-step of step t (t = 0..T-1), + 1 after its
// L-step (the last one is the L that produces the output). Alternating maximisation makes it
// non-decreasing in stable mode, and it never exceeds sum_n lse_n (the exact softmax's value).
void monarch_objective_trace(const TensorView& q, const TensorView& k, const MonarchOptions& opt,
                             double* f);
}  // namespace reference

}  // namespace strata
