// torch/library.cpp: the `strata` operator library (torch.ops.strata.*): every op's schema, in one
// place. The kernels are registered beside their bindings (TORCH_LIBRARY_IMPL in
// torch/ops_{attention,mlr,monarch,mlp}.cpp): CPU kernels for the forward / backward ops (not
// differentiable: their outputs never require grad), CompositeImplicitAutograd kernels for the
// differentiable ones (they run the C++ autograd Functions), catch-all kernels for the FLOP counts.
#include <torch/library.h>

// The options every MLR schema ends with (defaults as MlrArgs, strata/torch/mlr.h).
#define STRATA_MLR_OPTIONS                                                                             \
  "int[] ranks, int[] block_sizes=[], int context=0, Tensor? segment_starts=None, "                    \
  "Tensor? segment_offsets=None, bool mask_cross_segment=False, str scale=\"inv_rank\", "              \
  "bool divide_by_num_levels=False, bool level_average=False, bool causal=True, str layout=\"bshd\", " \
  "str compute=\"auto\""

TORCH_LIBRARY(strata, m) {
  // Dense attention (strata/torch/attention.h).
  m.def(
      "attention_forward(Tensor q, Tensor k, Tensor v, float? scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, int num_global=0, Tensor? key_padding_mask=None, "
      "Tensor? bias=None, str layout=\"bshd\", str compute=\"auto\") -> (Tensor out, Tensor lse)");
  m.def(
      "attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, "
      "float? scale=None, bool causal=False, int window_left=-1, int window_right=-1, int num_global=0, "
      "Tensor? key_padding_mask=None, Tensor? bias=None, str layout=\"bshd\", str compute=\"auto\") -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, float? scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, int num_global=0, Tensor? key_padding_mask=None, Tensor? bias=None, "
      "str layout=\"bshd\", str compute=\"auto\") -> Tensor out");
  // q, k, v packed as qkv: batch x seq x 3 x heads x head_dim (layout "bshd" only); one gradient.
  m.def(
      "attention_qkvpacked(Tensor qkv, float? scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, int num_global=0, Tensor? key_padding_mask=None, Tensor? bias=None, "
      "str layout=\"bshd\", str compute=\"auto\") -> Tensor out");
  m.def(
      "attention_qkvpacked_backward(Tensor qkv, Tensor out, Tensor lse, Tensor dout, float? scale=None, "
      "bool causal=False, int window_left=-1, int window_right=-1, int num_global=0, "
      "Tensor? key_padding_mask=None, Tensor? bias=None, str layout=\"bshd\", str compute=\"auto\") -> Tensor dqkv");
  m.def(
      "paper_gswa_attention(Tensor q, Tensor k, Tensor v, int split_a, int window, float? scale_a=None, "
      "float? scale_b=None, str layout=\"bshd\") -> Tensor out");

  // MLR attention (strata/torch/mlr.h).
  m.def("mlr_attention_forward(Tensor q, Tensor k, Tensor v, " STRATA_MLR_OPTIONS ") -> (Tensor out, Tensor lse)");
  m.def("mlr_attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, " STRATA_MLR_OPTIONS
        ") -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("mlr_attention(Tensor q, Tensor k, Tensor v, " STRATA_MLR_OPTIONS ") -> Tensor out");
  m.def("mlr_attention_qkvpacked(Tensor qkv, " STRATA_MLR_OPTIONS ") -> Tensor out");
  m.def("mlr_attention_qkvpacked_backward(Tensor qkv, Tensor out, Tensor lse, Tensor dout, " STRATA_MLR_OPTIONS
        ") -> Tensor dqkv");
  // MonarchAttention and the Performer / Nystromformer baselines (strata/torch/{monarch,baselines}.h).
  m.def(
      "monarch_attention_forward(Tensor q, Tensor k, Tensor v, int num_steps=1, int block_size=0, "
      "str pad=\"post\", str mode=\"stable\", float? scale=None, Tensor? key_padding_mask=None, "
      "str layout=\"bshd\", str compute=\"auto\", bool save_state=True) -> (Tensor out, Tensor state)");
  m.def(
      "monarch_attention_backward(Tensor q, Tensor k, Tensor v, Tensor? state, Tensor dout, int num_steps=1, "
      "int block_size=0, str pad=\"post\", str mode=\"stable\", float? scale=None, "
      "Tensor? key_padding_mask=None, str layout=\"bshd\", str compute=\"auto\") -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "monarch_attention(Tensor q, Tensor k, Tensor v, int num_steps=1, int block_size=0, str pad=\"post\", "
      "str mode=\"stable\", float? scale=None, Tensor? key_padding_mask=None, str layout=\"bshd\", "
      "str compute=\"auto\") -> Tensor out");
  m.def(
      "performer_attention(Tensor q, Tensor k, Tensor v, int num_features, int? seed=None, "
      "Tensor? key_padding_mask=None, float? scale=None, str layout=\"bshd\") -> Tensor out");
  // Performer's random features omega (head_dim x num_features float64 CPU; seeded: reproducible).
  // An op of its own so that torch.compile keeps the draw an opaque node (a Generator cannot be
  // traced).
  m.def("performer_omega(int head_dim, int num_features, int? seed=None) -> Tensor");
  m.def(
      "nystrom_attention(Tensor q, Tensor k, Tensor v, int num_landmarks, int pinv_iters=6, "
      "Tensor? key_padding_mask=None, float? scale=None, str layout=\"bshd\") -> Tensor out");
  // Bilinear BTT / MLR scoring and their transforms (strata/torch/bilinear_attention.h), the muP
  // RMS cap (strata/torch/mup.h); kernels in torch/bilinear_attention_ops.cpp.
  m.def("btt_factorize(int dim, str rule=\"ref\") -> int[]");
  m.def("btt_key_transform(Tensor x, Tensor w_k, Tensor w_q, int heads) -> Tensor");
  m.def("block_diag_transform(Tensor x, Tensor w, int heads) -> Tensor");
  m.def(
      "bilinear_btt_attention(Tensor x, Tensor w_k, Tensor w_q, Tensor key_norm_weight, Tensor? key_norm_bias, "
      "Tensor? x_norm_weight, Tensor? x_norm_bias, Tensor v_weight, Tensor? v_bias, Tensor out_weight, "
      "Tensor? out_bias, int num_heads, str logit_scale=\"sp\", bool causal=True, bool rms_cap=True) -> Tensor");
  m.def(
      "bilinear_mlr_attention(Tensor x, Tensor[] w_q, Tensor[] w_k, Tensor[] q_norm_weight, Tensor[] q_norm_bias, "
      "Tensor[] k_norm_weight, Tensor[] k_norm_bias, Tensor v_weight, Tensor? v_bias, Tensor out_weight, "
      "Tensor? out_bias, int num_heads, str logit_scale=\"sp\", bool divide_by_num_levels=False, bool causal=True, "
      "bool rms_cap=True) -> Tensor");
  m.def("mup_rms_cap(Tensor w, int d_in, int d_out) -> Tensor");
  // The fused block pieces (strata/torch/mlp.h; kernels in torch/ops_mlp.cpp): the GELU MLP
  // (optionally with its pre-LayerNorm and the residual) and LayerNorm + linear.
  m.def(
      "gelu_mlp_forward(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, Tensor? ln_weight=None, "
      "Tensor? ln_bias=None, float eps=1e-05, bool residual=False) -> (Tensor y, Tensor h, Tensor stats)");
  m.def(
      "gelu_mlp_backward(Tensor dy, Tensor x, Tensor w1, Tensor w2, Tensor h, Tensor stats, Tensor? ln_weight, "
      "Tensor? ln_bias, float eps, bool residual, bool[7] output_mask) -> (Tensor? dx, Tensor? dw1, Tensor? db1, "
      "Tensor? dw2, Tensor? db2, Tensor? dln_weight, Tensor? dln_bias)");
  m.def(
      "gelu_mlp(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, Tensor? ln_weight=None, "
      "Tensor? ln_bias=None, float eps=1e-05, bool residual=False) -> Tensor y");
  m.def(
      "ln_linear_forward(Tensor x, Tensor w, Tensor? b, Tensor? ln_weight=None, Tensor? ln_bias=None, "
      "float eps=1e-05) -> (Tensor y, Tensor stats)");
  m.def(
      "ln_linear_backward(Tensor dy, Tensor x, Tensor w, Tensor stats, Tensor? ln_weight, Tensor? ln_bias, "
      "float eps, bool[5] output_mask) -> (Tensor? dx, Tensor? dw, Tensor? db, Tensor? dln_weight, "
      "Tensor? dln_bias)");
  m.def(
      "ln_linear(Tensor x, Tensor w, Tensor? b, Tensor? ln_weight=None, Tensor? ln_bias=None, "
      "float eps=1e-05) -> Tensor y");
  // FLOP counts (2 x matmul MACs, per sequence).
  m.def("monarch_attention_flops(int N, int heads, int D, int Dv, int T, int B) -> float");
  m.def("softmax_attention_flops(int N, int D, int Dv=-1) -> float");
  m.def("performer_attention_flops(int N, int D, int Dv, int num_features) -> float");
  m.def("nystrom_attention_flops(int N, int D, int Dv, int num_landmarks, int pinv_iters=6) -> float");

  // Structured operators (strata/torch/structured.h): a spec is (int[] spec, float[] alpha).
  m.def("structured_forward(Tensor x, Tensor[] factors, int[] spec, float[] alpha) -> Tensor y");
  // The training forward: y and the right stages' outputs (float32 1-D) for structured_backward.
  m.def("structured_forward_saving(Tensor x, Tensor[] factors, int[] spec, float[] alpha) -> (Tensor y, Tensor saved)");
  m.def(
      "structured_backward(Tensor x, Tensor[] factors, int[] spec, float[] alpha, Tensor dy, bool input_grad=True, "
      "bool factor_grads=True, Tensor? saved=None) -> (Tensor? dx, Tensor[] dfactors)");
  m.def("structured_saved_layout(int[] spec, float[] alpha) -> (int tile_rows, int per_tile)");
  m.def("structured_linear(Tensor x, Tensor[] factors, int[] spec, float[] alpha) -> Tensor y");
  m.def("structured_to_dense(Tensor[] factors, int[] spec, float[] alpha) -> Tensor m");
  m.def("structured_low_rank_spec(int in_features, int out_features, int rank) -> int[]");
  m.def("structured_block_diagonal_spec(int in_features, int out_features, int blocks) -> int[]");
  m.def("structured_mlr_spec(int dim, int[] ranks, int[] blocks=[]) -> int[]");
  m.def(
      "structured_btt_spec(int in_features, int out_features, int rank=1, int heads=1, str factorize=\"reference\", "
      "int[] shape=[]) -> int[]");
  m.def("structured_monarch_spec(int n, int blocks=0) -> int[]");
  m.def("structured_kronecker_spec(int a_out, int a_in, int b_out, int b_in) -> int[]");
  m.def("structured_factor_shapes(int[] spec, float[] alpha) -> int[]");
  m.def("structured_stats(int[] spec, float[] alpha, int rows=1) -> (int params, float flops, int rank, int[] plan)");
}

#undef STRATA_MLR_OPTIONS
