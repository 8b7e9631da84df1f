"""strata.integrations.timm: strata's attentions inside a timm VisionTransformer (random weights,
tiny sizes, no download). "softmax" equals timm's own attention (outputs and gradients, fp32
round-off: the tolerances of test_integrations_transformers.py); Monarch, Nystrom and Performer
run forward and backward and equal strata's ops on the q, k, v the block computed.
"""

from __future__ import annotations

import copy

import pytest
import torch

import strata
from conftest import assert_raises_naming, rel_err

timm = pytest.importorskip("timm", reason="timm is not installed (the hf extra: pip install "
                           "'strata-attention[hf]'); strata.integrations.timm untested")
stimm = pytest.importorskip("strata.integrations.timm")

from timm.layers import Attention  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

OUT_TOL, GRAD_TOL = 2e-5, 2e-4


def vit(seed=0):
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=3,
                              num_heads=4, mlp_ratio=1.5, qkv_bias=True)
    with torch.no_grad():  # weights of std 0.2: peaked attention (timm's init gives nearly uniform rows)
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def images():
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def out_and_grads(model):
    model.zero_grad(set_to_none=True)
    out = model.forward_features(images())
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_softmax_equals_timm():
    model = vit()
    want, want_grads = out_and_grads(model)
    converted = copy.deepcopy(model)
    assert stimm.convert(converted, "softmax") == [f"blocks.{i}.attn" for i in range(3)]
    assert all(type(b.attn) is stimm.StrataAttention and isinstance(b.attn, Attention) for b in converted.blocks)
    got, got_grads = out_and_grads(converted)
    assert rel_err(got, want) <= OUT_TOL
    floor = 1e-3 * max(g.abs().max().item() for g in want_grads.values())  # zero-in-exact-arithmetic grads
    assert max(rel_err(got_grads[n], want_grads[n], floor) for n in want_grads) <= GRAD_TOL
    assert converted.state_dict().keys() == model.state_dict().keys()
    assert stimm.revert(converted) == [f"blocks.{i}.attn" for i in range(3)]
    assert rel_err(out_and_grads(converted)[0], want) == 0.0


OPS = {
    "monarch:T=2,B=4": lambda q, k, v, layer: strata.monarch_attention(q, k, v, num_steps=2, block_size=4,
                                                                     layout="bhsd"),
    "nystrom:landmarks=4": lambda q, k, v, layer: strata.nystrom_attention(q, k, v, 4, layout="bhsd"),
    "performer:features=16,seed=3": lambda q, k, v, layer: strata.performer_attention(q, k, v, 16, seed=3 + layer,
                                                                                     layout="bhsd"),
}


@pytest.mark.parametrize("spec", list(OPS))
def test_structured_methods(spec):
    model = vit()
    want_timm = model.forward_features(images()).detach()
    assert stimm.convert(model, spec, layers=[1, 2]) == ["blocks.1.attn", "blocks.2.attn"]
    assert type(model.blocks[0].attn) is Attention  # the others keep timm's attention
    rec = {}
    attn = model.blocks[1].attn
    h1 = attn.qkv.register_forward_hook(lambda _m, _i, o: rec.__setitem__("qkv", o.detach()))
    h2 = attn.proj.register_forward_pre_hook(lambda _m, i: rec.__setitem__("out", i[0].detach()))
    out, grads = out_and_grads(model)
    h1.remove()
    h2.remove()
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads.values())
    assert grads["blocks.1.attn.qkv.weight"].abs().max() > 0
    q, k, v = rec["qkv"].unflatten(-1, (3, attn.num_heads, attn.head_dim)).permute(2, 0, 3, 1, 4).unbind(0)
    want = OPS[spec](q, k, v, 1).transpose(1, 2).flatten(2)
    assert torch.equal(rec["out"], want), spec  # the same op on the same q, k, v: bitwise
    assert rel_err(out, want_timm) > 1e-4  # the approximation was applied


def test_masks_and_errors():
    model = vit()
    stimm.convert(model, "monarch:T=1,B=4")
    x = torch.randn(2, 17, 32)
    blk = model.blocks[0].attn
    pad = torch.ones(2, 1, 1, 17, dtype=torch.bool)
    pad[1, ..., 10:] = False  # a key padding mask: Monarch applies it
    got = blk(x, attn_mask=pad)
    qkv = blk.qkv(x).unflatten(-1, (3, 4, 8)).permute(2, 0, 3, 1, 4)
    want = strata.monarch_attention(*qkv.unbind(0), num_steps=1, block_size=4, key_padding_mask=pad[:, 0, 0],
                                    layout="bhsd")
    assert torch.equal(got, blk.proj(want.transpose(1, 2).flatten(2)))
    band = (torch.arange(17)[:, None] - torch.arange(17)[None, :]).abs() <= 3
    assert_raises_naming(ValueError, lambda: blk(x, attn_mask=band), "'attention_mask'")
    assert_raises_naming(ValueError, lambda: blk(x, is_causal=True), "'attention_mask'")
    blk.attn_drop.p = 0.1
    blk.train()
    assert_raises_naming(ValueError, lambda: blk(x), "'attn_drop'")
    assert_raises_naming(ValueError, lambda: stimm.convert(vit(), "softmax", layers=[3]), "'layers'")
    assert_raises_naming(ValueError, lambda: stimm.convert(vit(), "monarch:B=x"), "'spec'")
    assert_raises_naming(ValueError, lambda: stimm.convert(torch.nn.Linear(2, 2), "softmax"), "'model'")
    # softmax applies any mask, as timm's sdpa does
    model = vit()
    ref = model.blocks[0].attn(x, attn_mask=band)
    stimm.convert(model, "softmax")
    assert rel_err(model.blocks[0].attn(x, attn_mask=band), ref) <= OUT_TOL
