"""`strata embed` end to end (ctest cli_embed_npy_json): stdin to stdout as .npy, a file as JSON,
and --batch-size 1 (one sentence per forward); numpy and json read them back; shapes, dtype, unit
rows, and the three agree. Usage: check_embed.py STRATA_CLI SENTENCES_FILE OUT_DIR. Exit 77
(ctest SKIP_RETURN_CODE) when all-MiniLM-L6-v2 is not installed. tests/python/test_embed.py checks
the CLI against strata.SentenceEncoder."""
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

cli, sentences, out_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
out_dir.mkdir(parents=True, exist_ok=True)
n = len(sentences.read_text(encoding="utf-8").split("\n")) - 1
spec = "monarch:T=2,B=8@3,4,5"


def embed(*args: str, stdin: bytes = b"") -> bytes:
    proc = subprocess.run([cli, "embed", "--method", spec, "--threads", "1", *args], input=stdin,
                          capture_output=True, timeout=300)
    if proc.returncode != 0 and b"is missing" in proc.stderr:
        print(proc.stderr.decode(), end="")
        sys.exit(77)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout


npy = np.load(io.BytesIO(embed(stdin=sentences.read_bytes())))
assert npy.dtype == np.float32 and npy.shape == (n, 384), (npy.dtype, npy.shape)
assert np.abs(np.linalg.norm(npy, axis=1) - 1).max() < 1e-5
embed("--input", str(sentences), "--output", str(out_dir / "embed.json"))
doc = json.loads((out_dir / "embed.json").read_text())
assert doc["method"] == spec and doc["count"] == n and doc["dim"] == 384, {k: doc[k] for k in doc if k != "embeddings"}
assert np.array_equal(np.array(doc["embeddings"], dtype=np.float32), npy)  # same thread count: same floats
embed("--input", str(sentences), "--output", str(out_dir / "one_at_a_time.npy"), "--batch-size", "1")
diff = np.abs(np.load(out_dir / "one_at_a_time.npy") - npy).max()
assert diff < 1e-5, diff  # fp32 round-off of the GEMMs at another batch size
print(f"strata embed: {n} sentences, npy == json, batched vs one at a time max |diff| {diff:.2e}")
