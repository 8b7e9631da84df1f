// src/cpu/attention_params.h: the POD parameter structs of the attention kernels: AttnIO (what
// every attention kernel reads and writes; MlrParams extends it too) and DenseAttnParams.
// Filled by src/cpu/attention.cpp after validation; read by every ISA variant of the kernel.
// All strides are in elements, in the logical order (batch, seq, head, dim).
#pragma once
#include <cstdint>

#include "core/bf16_gemm.h"
#include "core/dispatch.h"
#include "strata/tensor.h"

namespace strata::cpu {

struct Strided4 {
  void* data = nullptr;
  int64_t sb = 0, ss = 0, sh = 0, sd = 0;  // batch, seq, head, dim strides
};

// What every attention kernel reads and writes: the sizes, q, k, v and o, the lse, and in a backward
// the gradients. Filled from checked views by fill_io / fill_grads (src/cpu/views.h).
struct AttnIO {
  DType dtype = DType::f32;  // of q, k, v, o, dout, dq, dk, dv
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads_q = 0, heads_kv = 0;
  int64_t head_dim = 0, head_dim_v = 0;
  Strided4 q, k, v, o;                   // q: B x Nq x Hq x D, k: B x Nk x Hkv x D, v: .. x Dv,
                                         // o: B x Nq x heads() x Dv
  float* lse = nullptr;                  // B x heads() x Nq (natural log)
  int64_t lse_sb = 0, lse_sh = 0, lse_ss = 0;
  // backward only
  Strided4 dout, dq, dk, dv;             // dout: like o; dq, dk, dv: like q, k, v

  // Heads of o, lse, dout: the larger of heads_q, heads_kv (one divides the other; AttnDims).
  int64_t heads() const { return heads_q > heads_kv ? heads_q : heads_kv; }
  // The query head and the kv head output head h reads.
  int64_t q_head(int64_t h) const { return h / (heads() / heads_q); }
  int64_t kv_head(int64_t h) const { return h / (heads() / heads_kv); }
};

struct DenseAttnParams : AttnIO {
  float scale = 1.f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1 = unbounded
  int64_t num_global = 0;
  const uint8_t* key_padding_mask = nullptr;   // B x Nk, nonzero = keep
  int64_t kpm_sb = 0, kpm_ss = 0;
  const void* bias = nullptr;                   // broadcast B x Hq x Nq x Nk
  DType bias_dtype = DType::f32;
  int64_t bias_sb = 0, bias_sh = 0, bias_sq = 0, bias_sk = 0;
  // The bf16 engine of the products (forward_bf16, backward_bf16: bf16 inputs, the resolved Compute).
  const bf16::Gemms* bf16_gemms = nullptr;
};

// Calls with at most this many queries (decoding) take the forward's row path (keys read in
// place, fp32 products), whatever the Compute option.
constexpr int64_t kDenseDecodeRows = 4;

// The family's entry points, one table per ISA (src/cpu/kernels/attention.inc defines it; dispatch:
// src/core/dispatch.h).
struct DenseKernels {
  void (*forward)(const DenseAttnParams& p);
  void (*backward)(const DenseAttnParams& p);
  // The tiled forward with bf16 products on p.bf16_gemms (bf16 inputs, more than kDenseDecodeRows
  // queries); null in the units below AVX-512.
  void (*forward_bf16)(const DenseAttnParams& p);
  // The backward with its score products (Q K^T, dO V^T) on p.bf16_gemms; null below AVX-512.
  void (*backward_bf16)(const DenseAttnParams& p);
};
STRATA_PER_ISA(extern const DenseKernels kDenseKernels;)

}  // namespace strata::cpu
