// strata/torch/baselines.h: the low-rank baselines MonarchAttention is compared with (design:
// docs/methods.md; ref: experiments/common/baselines.py), written with
// ATen ops, so torch's autograd differentiates them (any order) and every dtype ATen has works
// (float64 for gradcheck). Not kernels: they run at ATen speed.
//
// Tensors: CPU (or any device ATen supports), layout "bshd" ("bhsd" swaps dims 1 and 2):
//   q: batch x seq x heads_q  x head_dim,  k: batch x seq x heads_kv x head_dim (heads_q % heads_kv == 0)
//   v: batch x seq x heads_kv x head_dim_v;  out: batch x seq x heads_q x head_dim_v, dtype of q
//   key_padding_mask: batch x seq, bool/uint8, true = token. Masked tokens are never keys, never
//   landmarks, and their own output rows are zeros (with zero gradient), as ref's Performer.
// Self-attention only (q and k have the same seq). scale: logits scale * q.k, default 1/sqrt(D).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace strata::torch {

// --- Performer (Choromanski et al. 2021), FAVOR+ positive features as in ref ---
// x = q * scale^(1/2), y = k * scale^(1/2)  (ref: q, k / D^(1/4));  omega: head_dim x r standard
// Gaussian (iid, NOT orthogonal: ref's current code), shared by all batches and heads of a call;
//   phi(x) = exp(x omega - |x|^2 / 2) / sqrt(r)      (E[phi(x).phi(y)] = exp(x.y))
//   out_n  = phi(x_n) sum_m phi(y_m)^T v_m / (phi(x_n) . sum_m phi(y_m))     over unmasked m
// Computed with exponents shifted by a per-query-row max and a per-(batch, head) key max (the
// shifts cancel exactly in the ratio; no overflow), and without ref's +1e-8 in the denominator
// (a row whose denominator underflows to 0 outputs zeros).
// omega: seed given -> drawn from a CPU generator seeded with `seed` (same seed, bitwise the same
// features; the output is NOT bitwise reproducible: the first call of a process was seen 2.5e-5
// (relative) off later ones, cause not found, inside ATen / MKL); no seed -> drawn from ATen's default generator (at::manual_seed /
// torch.manual_seed), i.e. new features on every call, as ref.
at::Tensor performer_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               int64_t num_features, std::optional<int64_t> seed = {},
                               const std::optional<at::Tensor>& key_padding_mask = {},
                               std::optional<double> scale = {}, const std::string& layout = "bshd");

// The omega performer_attention uses: head_dim x num_features, float64, drawn by
// at::randn(..., float64) from the seeded generator (or the default one), before any cast.
at::Tensor performer_omega(int64_t head_dim, int64_t num_features, std::optional<int64_t> seed = {});

// --- Nystromformer (Xiong et al. 2021), as ref (itself after mlpen/Nystromformer) ---
// Landmarks: the n valid tokens of a sequence (in order) are cut into m = min(num_landmarks, seq)
// contiguous segments, token of rank r (0-based among the valid ones) in segment floor(r m / n);
// q~_j, k~_j = means of q, k over segment j. With s = scale:
//   F = softmax_rows(s q k~^T)            seq x m
//   A = softmax_rows(s q~ k~^T)           m x m,  A+ ~ pinv(A) by pinv_iters iterations of
//       Z <- Z (13I - AZ (15I - AZ (7I - AZ))) / 4,  Z0 = A^T / (max col sum |A| * max row sum |A|)
//   B = softmax_rows(s q~ k^T)            m x seq, over valid keys
//   out = F (A+ (B v))
// Differences from ref, all for sequences ref does not handle well: ref truncates the last
// seq mod m tokens out of the landmarks (here every token is in a segment); ref zeroes masked q, k
// and averages them into the landmarks (here landmarks average valid tokens only, so a padded
// sequence gives exactly the result of the unpadded one); ref's Z0 scale is a max over the whole
// batch (here per (batch, head) matrix: results do not depend on the other sequences). When
// n < m (short or heavily masked sequences) segments are empty: empty landmarks are dropped
// (masked out of F, A and B; A gets an identity block there, which the iteration keeps separate),
// which equals running with n landmarks. A sequence with no valid token outputs zeros.
// m = seq (no mask): every segment is one token, F = A = B = softmax(s q k^T), and the output is
// softmax attention up to the pinv iteration error (the residual I - AZ contracts as
// r -> r^3 (3 + r) / 4 per iteration).
at::Tensor nystrom_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_landmarks,
                             int64_t pinv_iters = 6, const std::optional<at::Tensor>& key_padding_mask = {},
                             std::optional<double> scale = {}, const std::string& layout = "bshd");

// --- FLOPs: 2 x multiply-accumulates of the matmuls, per (sequence, query head) ---
// softmax:    N^2 (D + Dv)                              (Q K^T, P V)   -> 4 N^2 D for Dv = D
//             (the core's strata::attention_flops of one non-causal forward)
double softmax_attention_flops(int64_t N, int64_t D, int64_t Dv = -1);  // Dv < 0: Dv = D
// performer:  N r (2 D + 2 Dv + 1)                      (q omega, k omega, phi_k^T v, phi_q (.),
//             phi_q . sum phi_k). ref's counter (aten.bmm only) misses q omega and k omega (they
//             run as aten.mm), i.e. it reports N r (2 Dv + 1); we count the projections.
double performer_attention_flops(int64_t N, int64_t D, int64_t Dv, int64_t num_features);
// nystrom:    with m = min(num_landmarks, N):
//             N m D (F) + m^2 D (A) + m N D (B) + 6 iters m^3 (pinv: six m x m x m products per
//             iteration) + m N Dv (B v) + m^2 Dv (A+ .) + N m Dv (F .)
//             = 2 N m (D + Dv) + m^2 (D + Dv) + 6 iters m^3      (segment means are not matmuls)
double nystrom_attention_flops(int64_t N, int64_t D, int64_t Dv, int64_t num_landmarks, int64_t pinv_iters = 6);

}  // namespace strata::torch
