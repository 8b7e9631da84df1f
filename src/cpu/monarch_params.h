// src/cpu/monarch_params.h: the POD parameter struct of the MonarchAttention kernels.
// Filled by src/cpu/monarch.cpp after validation; read by every ISA variant of the kernel.
// All strides are in elements, in the logical order (batch, seq, head, dim).
#pragma once
#include <cstdint>

#include "core/bf16_gemm.h"
#include "core/dispatch.h"
#include "cpu/attention_params.h"  // Strided4
#include "strata/tensor.h"

namespace strata::cpu {

struct MonarchParams {
  DType dtype = DType::f32;  // of q, k, v, o, dout, dq, dk, dv
  int64_t batch = 0, seqlen = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  int64_t block = 1;      // B: tokens per block
  int64_t nblocks = 0;    // M = ceil(seqlen / B)
  int64_t pad_front = 0;  // padded positions before token 0 (padded length is M * B)
  int64_t steps = 1;      // T
  bool stable = true;     // MonarchMode::stable (else reference: ma_torch.py's eps arithmetic)
  float scale = 1.f;
  Strided4 q, k, v, o;    // q: B x N x Hq x D, k: B x N x Hkv x D, v: .. x Dv, o: B x N x Hq x Dv
  const uint8_t* key_padding_mask = nullptr;  // B x N, nonzero = keep
  int64_t kpm_sb = 0, kpm_ss = 0;
  float* state = nullptr;  // optional: B x Hq x (T-1) x (M*B) x D, fp32
  int64_t st_sb = 0, st_sh = 0, st_st = 0, st_sp = 0, st_sd = 0;
  // the bf16 engine of the products (bf16 inputs, src/core/bf16_gemm.h), or null: the forward's
  // six, the backward's gradient products (src/cpu/kernels/monarch.inc)
  const bf16::Gemms* bf16_gemms = nullptr;
  // backward only
  Strided4 dout, dq, dk, dv;
};

// The family's entry points, one table per ISA (src/cpu/kernels/monarch.inc defines it; dispatch:
// src/core/dispatch.h).
struct MonarchKernels {
  void (*forward)(const MonarchParams& p);
  void (*backward)(const MonarchParams& p);
};
STRATA_PER_ISA(extern const MonarchKernels kMonarchKernels;)

}  // namespace strata::cpu
