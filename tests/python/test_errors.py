"""Bad arguments to every Python wrapper: the exception type and a message that names the argument.

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python/test_errors.py

Three kinds (python/strata/__init__.py docstring):
  - wrong types, checked in Python without coercion (strata._check): TypeError. A bool option
    takes only a bool (causal="False" used to run causal), an int option only an int (window=(2.7, 0)
    used to run with 2), a tensor argument only a tensor;
  - wrong values found in Python (MLRAttention's sizes, its missing context): ValueError;
  - what the ops check (dtypes, shapes, ranges): RuntimeError, whose dtype list is the op's own
    (not every dtype a view can hold).
Every message must contain "argument '<name>'".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import strata


def qkv(dtype=torch.float32):
    """q, k, v: batch 1, seq 6, 2 heads, head_dim 8 (BSHD)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 6, 2, 8, generator=g).to(dtype) for _ in range(3)]


def mlr(**opts):
    q, k, v = qkv()
    return strata.mlr_attention(q, k, v, opts.pop("ranks", [4, 4]), **opts)


def module(**opts):
    """A small MLRAttention (embed 16, 2 heads, ranks 4|4, context 8) with options replaced."""
    args = dict(embed_dim=16, num_heads=2, ranks=[4, 4], context=8)
    args.update(opts)
    return strata.MLRAttention(args.pop("embed_dim"), args.pop("num_heads"), args.pop("ranks"), **args)


class Site(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = strata.SoftmaxAttention()


# name: (call, exception type, the argument the message must name)
CASES = {
    # strata.attention and its kernels
    "attention_causal_str": (lambda: strata.attention(*qkv(), causal="False"), TypeError, "causal"),
    "attention_causal_int": (lambda: strata.attention(*qkv(), causal=1), TypeError, "causal"),
    "attention_window_float": (lambda: strata.attention(*qkv(), window=(2.7, 0)), TypeError, "window[0]"),
    "attention_window_str": (lambda: strata.attention(*qkv(), window=("a", 0)), TypeError, "window[0]"),
    "attention_window_bool": (lambda: strata.attention(*qkv(), window=(2, True)), TypeError, "window[1]"),
    "attention_window_scalar": (lambda: strata.attention(*qkv(), window=3), TypeError, "window"),
    "attention_window_triple": (lambda: strata.attention(*qkv(), window=(1, 2, 3)), TypeError, "window"),
    "attention_num_global_float": (lambda: strata.attention(*qkv(), num_global=1.5), TypeError, "num_global"),
    "attention_num_global_bool": (lambda: strata.attention(*qkv(), num_global=True), TypeError, "num_global"),
    "attention_q_none": (lambda: strata.attention(None, *qkv()[1:]), TypeError, "q"),
    "attention_v_list": (lambda: strata.attention(*qkv()[:2], [1.0]), TypeError, "v"),
    "attention_scale_str": (lambda: strata.attention(*qkv(), scale="0.5"), TypeError, "scale"),
    "attention_scale_bool": (lambda: strata.attention(*qkv(), scale=True), TypeError, "scale"),
    "attention_layout_int": (lambda: strata.attention(*qkv(), layout=1), TypeError, "layout"),
    "attention_mask_list": (lambda: strata.attention(*qkv(), key_padding_mask=[True] * 6), TypeError,
                            "key_padding_mask"),
    "forward_causal_str": (lambda: strata.attention_forward(*qkv(), causal="yes"), TypeError, "causal"),
    "backward_dout_none": (lambda: strata.attention_backward(*qkv(), *strata.attention_forward(*qkv()), None),
                           TypeError, "dout"),
    "gswa_split_float": (lambda: strata.paper_gswa_attention(*qkv(), 2.5, 3), TypeError, "split_a"),
    "gswa_window_bool": (lambda: strata.paper_gswa_attention(*qkv(), 2, True), TypeError, "window"),
    "gswa_scale_a_str": (lambda: strata.paper_gswa_attention(*qkv(), 2, 3, scale_a="1"), TypeError, "scale_a"),
    "gswa_scale_b_inf": (lambda: strata.paper_gswa_attention(*qkv(), 2, 3, scale_b=float("inf")), RuntimeError,
                         "scale_b"),
    # strata.mlr
    "mlr_causal_str": (lambda: mlr(causal="False"), TypeError, "causal"),
    "mlr_mask_cross_segment_str": (lambda: mlr(mask_cross_segment="no"), TypeError, "mask_cross_segment"),
    "mlr_divide_by_num_levels_int": (lambda: mlr(divide_by_num_levels=1), TypeError, "divide_by_num_levels"),
    "mlr_level_average_str": (lambda: mlr(level_average="False"), TypeError, "level_average"),
    "mlr_ranks_float": (lambda: mlr(ranks=[4.5, 3.5]), TypeError, "ranks[0]"),
    "mlr_ranks_none": (lambda: mlr(ranks=None), TypeError, "ranks"),
    "mlr_ranks_float_tensor": (lambda: mlr(ranks=torch.tensor([4.0, 4.0])), TypeError, "ranks"),
    "mlr_block_sizes_float": (lambda: mlr(block_sizes=[8.0, 4]), TypeError, "block_sizes[0]"),
    "mlr_context_float": (lambda: mlr(context=8.0), TypeError, "context"),
    "mlr_compute_none": (lambda: mlr(compute=None), TypeError, "compute"),
    "mlr_segment_starts_float": (lambda: mlr(segment_starts=[4.7, 9.2]), TypeError, "segment_starts[0]"),
    "mlr_segment_offsets_str": (lambda: mlr(segment_starts=[2], segment_offsets="0,1"), TypeError,
                                "segment_offsets"),
    "mlr_q_none": (lambda: strata.mlr_attention(None, *qkv()[1:], [4, 4]), TypeError, "q"),
    "mlr_forward_k_none": (lambda: strata.mlr_attention_forward(qkv()[0], None, qkv()[2], [4, 4]), TypeError, "k"),
    "pack_segments_flat": (lambda: strata.pack_segments([5, 11]), TypeError, "lists[0]"),
    "pack_segments_none": (lambda: strata.pack_segments(None), TypeError, "lists"),
    "pack_segments_float": (lambda: strata.pack_segments([[1.5]]), TypeError, "lists[0][0]"),
    "module_embed_dim_zero": (lambda: module(embed_dim=0), ValueError, "embed_dim"),
    "module_embed_dim_float": (lambda: module(embed_dim=16.0), TypeError, "embed_dim"),
    "module_num_heads_zero": (lambda: module(num_heads=0), ValueError, "num_heads"),
    "module_num_heads_not_divisor": (lambda: module(num_heads=3), ValueError, "num_heads"),
    "module_num_kv_heads_float": (lambda: module(num_kv_heads=1.0), TypeError, "num_kv_heads"),
    "module_causal_str": (lambda: module(causal="False"), TypeError, "causal"),
    "module_qk_layernorm_int": (lambda: module(qk_layernorm=1), TypeError, "qk_layernorm"),
    "module_context_missing": (lambda: module(context=0), ValueError, "context"),
    "module_x_none": (lambda: module()(None), TypeError, "x"),
    "module_x_float64": (lambda: module()(torch.randn(1, 4, 16, dtype=torch.float64)), RuntimeError, "x"),
    # strata.monarch
    "monarch_num_steps_float": (lambda: strata.monarch_attention(*qkv(), num_steps=2.0), TypeError, "num_steps"),
    "monarch_block_size_bool": (lambda: strata.monarch_attention(*qkv(), block_size=True), TypeError, "block_size"),
    "monarch_num_steps_huge": (lambda: strata.monarch_attention(*qkv(), num_steps=2**40), RuntimeError, "num_steps"),
    # 2**40 steps: the state was a raw allocator error and monarch_attention (no grad) never ended
    "monarch_forward_num_steps_huge": (lambda: strata.monarch_attention_forward(*qkv(), num_steps=2**40),
                                       RuntimeError, "num_steps"),
    "monarch_module_num_steps_str": (lambda: strata.MonarchAttention(num_steps="2"), TypeError, "num_steps"),
    "performer_features_float": (lambda: strata.performer_attention(*qkv(), 8.5), TypeError, "num_features"),
    "performer_seed_float": (lambda: strata.performer_attention(*qkv(), 8, seed=1.5), TypeError, "seed"),
    # issue 48 item 6: finite q, k near 1e20 gave NaN with no error (the logits overflow fp32)
    "attention_logits_overflow": (lambda: strata.attention(qkv()[0] * 1e20, qkv()[1] * 1e20, qkv()[2]), RuntimeError,
                                  "q"),
    "mlr_logits_overflow": (lambda: strata.mlr_attention(qkv()[0] * 1e20, qkv()[1] * 1e20, qkv()[2], [4, 4],
                                                         context=6), RuntimeError, "q"),
    "monarch_logits_overflow": (lambda: strata.monarch_attention(qkv()[0] * 1e20, qkv()[1] * 1e20, qkv()[2]),
                                RuntimeError, "q"),
    # issue 48 item 5: 2^40 features were the allocator's raw error
    "performer_features_huge": (lambda: strata.performer_attention(*qkv(), 2**40), RuntimeError, "num_features"),
    # issue 48 item 4: a negative or NaN std was replaced by the rule's default; an inner width of
    # 2^61 was accepted with params() = 0 (the counts wrapped)
    "mup_role_std_negative": (lambda: strata.mup.MupRole.structured_core(16, std=-1.0), ValueError, "init_std"),
    "mup_role_std_nan": (lambda: strata.mup.MupRole.structured_core(16, std=float("nan")), ValueError, "init_std"),
    "mup_role_embedding_std_inf": (lambda: strata.mup.MupRole.embedding(std=float("inf")), ValueError, "init_std"),
    "structured_inner_2_61": (lambda: strata.structured.StructuredSpec(_with_inner(2**61)), RuntimeError,
                              "spec.levels[0].inner"),
    "structured_inner_storage_past_2_36": (lambda: strata.structured.StructuredSpec(_with_inner(2**31, 64)), RuntimeError,
                                           "spec.levels[0].inner"),
    "nystrom_pinv_iters_float": (lambda: strata.nystrom_attention(*qkv(), 3, pinv_iters=6.0), TypeError,
                                 "pinv_iters"),
    "flops_n_float": (lambda: strata.monarch_attention_flops(10.0, 1, 8, 8, 1, 2), TypeError, "N"),
    "convert_returns_none": (lambda: strata.convert_attention(Site(), lambda i: None), TypeError, "make_attention"),
    "convert_not_callable": (lambda: strata.convert_attention(Site(), 5), TypeError, "make_attention"),
    "convert_layers_float": (lambda: strata.convert_attention(Site(), lambda i: strata.MonarchAttention(), [0.0]),
                             TypeError, "layers"),
    # dtype messages list the dtypes the op accepts (RuntimeError from the ops)
    "attention_forward_q_int": (lambda: strata.attention_forward(qkv()[0].int(), *qkv()[1:]), RuntimeError, "q"),
    "attention_forward_k_int": (lambda: strata.attention_forward(qkv()[0], qkv()[1].int(), qkv()[2]), RuntimeError,
                                "k"),
    "attention_bias_float64": (lambda: strata.attention(*qkv(), bias=torch.zeros(6, 6, dtype=torch.float64)),
                               RuntimeError, "bias"),
    "attention_mask_int64": (lambda: strata.attention(*qkv(), key_padding_mask=torch.ones(1, 6, dtype=torch.int64)),
                             RuntimeError, "key_padding_mask"),
    "monarch_q_int": (lambda: strata.monarch_attention_forward(qkv()[0].int(), *qkv()[1:]), RuntimeError, "q"),
    # sizes past what the kernels handle exactly: a clear error, not a wrong result or the allocator's
    "monarch_state_larger_than_memory": (lambda: strata.monarch_attention_forward(
        *(t[:, :1].expand(1, 2**20, 2, 8) for t in qkv()), num_steps=1024), RuntimeError, "num_steps"),
    "attention_causal_over_2_24_keys": (lambda: strata.attention_forward(
        qkv()[0], *(t[:, :1].expand(1, 2**24 + 300, 2, 8) for t in qkv()[1:]), causal=True), RuntimeError, "k"),
}


def _with_inner(inner: int, width: int = 16) -> list:
    """A low-rank width -> width spec's integers with level 0's inner width replaced (hand-built)."""
    ints = list(strata.structured.low_rank(width, width, 4).ints)
    assert ints[3] == 4, ints  # [in, out, levels, inner of level 0, ...]
    ints[3] = inner
    return ints


@pytest.mark.parametrize("name", list(CASES))
def test_bad_argument_raises_naming_it(name):
    call, exc, arg = CASES[name]
    with pytest.raises(exc) as info:
        call()
    assert f"argument '{arg}'" in str(info.value), str(info.value)


# The exact dtype lists: the op's own (not every dtype a view can hold: "float32, bfloat16, float64, uint8 or bool"
# for q and "float32 or float32" for a float64 bias named dtypes the op does not accept).
DTYPE_MESSAGES = {
    "attention_forward_q_int": "attention_forward: argument 'q': expected dtype float32 or bfloat16, got int32",
    "attention_forward_k_int": "attention_forward: argument 'k': expected dtype float32 (same as q), got int32",
    "attention_bias_float64": "argument 'bias': expected dtype float32, got float64",
    "attention_mask_int64": "argument 'key_padding_mask': expected dtype bool or uint8, got int64",
    "monarch_q_int": "monarch_attention_forward: argument 'q': expected dtype float32 or bfloat16, got int32",
}


@pytest.mark.parametrize("name", list(DTYPE_MESSAGES))
def test_dtype_messages_list_the_accepted_dtypes(name):
    call, exc, _ = CASES[name]
    with pytest.raises(exc) as info:
        call()
    assert DTYPE_MESSAGES[name] in str(info.value), str(info.value)


def test_differentiable_ops_name_their_own_dtypes():
    """strata.attention and monarch_attention also take float64 (the reference): their q message says so."""
    for fn in (strata.attention, strata.monarch_attention):
        with pytest.raises(RuntimeError, match="argument 'q': expected dtype float32, bfloat16 or float64, got int32"):
            fn(qkv()[0].int(), *qkv()[1:])


def test_exact_types_are_accepted():
    """numpy scalars, int64 tensors and numpy bools stand for ints and bools (no false alarms)."""
    q, k, v = qkv()
    want = strata.attention(q, k, v, causal=True, window=(2, 0), num_global=1)
    got = strata.attention(q, k, v, causal=np.bool_(True), window=(np.int64(2), np.int32(0)), num_global=np.int16(1))
    assert torch.equal(got, want)
    want = strata.mlr_attention(q, k, v, [4, 4], block_sizes=[4, 2], segment_starts=[3])
    got = strata.mlr_attention(q, k, v, torch.tensor([4, 4]), block_sizes=np.array([4, 2]),
                               segment_starts=torch.tensor([3]))
    assert torch.equal(got, want)
    starts, offsets = strata.pack_segments([np.array([2, 4]), torch.tensor([3]), ()])
    assert starts.tolist() == [2, 4, 3] and offsets.tolist() == [0, 2, 3, 3]


def test_convert_attention_with_a_bad_factory_leaves_the_model_unchanged():
    model = Site()
    before = model.attention
    with pytest.raises(TypeError, match="argument 'make_attention'"):
        strata.convert_attention(model, lambda i: None)
    assert model.attention is before
