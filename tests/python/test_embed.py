"""strata.SentenceEncoder and `strata embed` (the converted encoder on the user's own text) give the
same embeddings for the same sentences and spec; batched by length equals one at a time; the
.npy and JSON outputs read back (numpy, json); bad arguments name themselves.

tests/cpp/encoder_embed_test.cpp checks the C++ encoder against the conversion benchmark's encoder
object; here the CLI and Python, which both run that encoder. Skips (with the reason) when
all-MiniLM-L6-v2 is not installed (scripts/setup_encoder.sh), and the CLI tests when no built CLI
is found (a pip-installed package has none: STRATA_CLI names one).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import List

import pytest
import torch

import strata
from conftest import assert_raises_naming

np = pytest.importorskip("numpy")

SENTENCES_FILE = Path(__file__).resolve().parents[1] / "cli" / "embed_sentences.txt"
# Rows are unit vectors (entries ~0.05). The CLI and Python run the same C++ encoder, possibly on
# different thread counts, so only the GEMMs' fp32 blocking differs: 1e-5 is ~200 ulps of an entry.
TOL = 1e-5


def sentences() -> List[str]:
    """The test sentences, one per line (an empty line is an empty sentence), as the CLI reads them."""
    return SENTENCES_FILE.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def softmax_encoder() -> strata.SentenceEncoder:
    try:
        return strata.SentenceEncoder.load("softmax")
    except RuntimeError as e:
        if "is missing" in str(e):
            pytest.skip(f"all-MiniLM-L6-v2 not installed: {e}")
        raise


def cli_path() -> Path:
    """The built `strata` CLI: $STRATA_CLI, else build/<config>/strata beside the loaded library."""
    env = os.environ.get("STRATA_CLI")
    path = Path(env) if env else Path(strata.library_path).parent.parent / "strata"
    if not path.is_file():
        pytest.skip(f"no strata CLI at {path} (set STRATA_CLI)")
    return path


def run_cli(*args: str, stdin: bytes = b"", check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(cli_path()), "embed", *args], input=stdin, capture_output=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


def max_diff(a, b) -> float:
    return (torch.as_tensor(a).double() - torch.as_tensor(b).double()).abs().max().item()


@pytest.mark.parametrize("spec", ["softmax", "monarch:T=2,B=8", "monarch:T=2@0,1,2", "nystrom:landmarks=8@3,4,5"])
def test_cli_equals_python(softmax_encoder, tmp_path, spec):
    out = tmp_path / "emb.npy"
    run_cli("--method", spec, "--input", str(SENTENCES_FILE), "--output", str(out), "--batch-size", "4")
    cli = np.load(out)
    assert cli.dtype == np.float32 and cli.shape == (len(sentences()), 384)
    py = strata.SentenceEncoder.load(spec).encode(sentences(), batch_size=4)
    assert py.dtype == torch.float32 and py.shape == (len(sentences()), 384)
    assert max_diff(cli, py) <= TOL, spec
    if spec != "softmax":  # the spec was applied: not the softmax model's embeddings
        assert max_diff(py, softmax_encoder.encode(sentences())) > 1e-3


def test_batched_by_length_equals_one_at_a_time(softmax_encoder):
    # Monarch at its default block floor(sqrt(N)): a length-dependent method, where padding a
    # sentence to its batch's longest would change the result.
    enc = strata.SentenceEncoder.load("monarch:T=2", layers=[0, 1, 2])
    texts = sentences()
    batched = enc.encode(texts, batch_size=32)
    alone = torch.cat([enc.encode([t], batch_size=1) for t in texts])
    assert max_diff(batched, alone) <= TOL
    assert max_diff(batched.norm(dim=1), torch.ones(len(texts))) <= TOL


def test_stdin_to_stdout_npy(softmax_encoder):
    proc = run_cli("--method", "softmax", stdin=SENTENCES_FILE.read_bytes())
    emb = np.load(io.BytesIO(proc.stdout))
    assert emb.dtype == np.float32 and emb.shape == (len(sentences()), 384)
    assert max_diff(emb, softmax_encoder.encode(sentences())) <= TOL
    assert b"sentences -> stdout" in proc.stderr


def test_json_output_equals_npy_output(softmax_encoder, tmp_path):
    # One thread in both runs: the same computation, so the floats (written in their shortest
    # round-trip form) must read back bit-equal.
    common = ["--input", str(SENTENCES_FILE), "--threads", "1"]
    run_cli("--method", "monarch:T=2,B=8", "--layers", "3", "4", "5", "--output", str(tmp_path / "e.json"), *common)
    run_cli("--method", "monarch:T=2,B=8@3,4,5", "--format", "npy", "--output", str(tmp_path / "e.bin"), *common)
    doc = json.loads((tmp_path / "e.json").read_text())
    assert doc["method"] == "monarch:T=2,B=8@3,4,5" and doc["layers"] == [3, 4, 5]
    assert doc["spec"] == "monarch:T=2,B=8,pad=post,mode=stable"
    assert doc["count"] == len(sentences()) and doc["dim"] == 384 and doc["max_length"] == 256
    from_json = np.array(doc["embeddings"], dtype=np.float32)
    assert from_json.shape == (len(sentences()), 384)
    assert np.array_equal(from_json, np.load(tmp_path / "e.bin"))


def test_max_length_truncates(softmax_encoder, tmp_path):
    long_text = "the river bends past the mill " * 100
    enc = strata.SentenceEncoder.load("softmax", max_length=16)
    assert enc.max_length == 16
    out = tmp_path / "e.npy"
    run_cli("--max-length", "16", "--output", str(out), stdin=(long_text + "\n").encode())
    assert max_diff(np.load(out), enc.encode([long_text])) <= TOL
    assert max_diff(enc.encode([long_text]), softmax_encoder.encode([long_text])) > 1e-4


def test_progress_bar_on_request(softmax_encoder, capfd):
    n = len(sentences())
    softmax_encoder.encode(sentences(), batch_size=2, progress=True)
    assert f"SentenceEncoder.encode: [{'#' * 30}] {n}/{n} sentences" in capfd.readouterr().err
    softmax_encoder.encode(sentences())
    assert capfd.readouterr().err == ""
    # The CLI: with --progress, and never on a stderr that is not a terminal without it.
    assert f"] {n}/{n} sentences" in run_cli("--progress", stdin=SENTENCES_FILE.read_bytes()).stderr.decode()
    assert "sentences, " not in run_cli(stdin=SENTENCES_FILE.read_bytes()).stderr.decode()


def test_encoder_properties(softmax_encoder):
    enc = strata.SentenceEncoder.load("monarch:T=2,B=8", layers=(3, 4, 5))
    assert enc.method == "monarch:T=2,B=8@3,4,5"
    assert enc.spec == "monarch:T=2,B=8,pad=post,mode=stable"
    assert enc.layers == [3, 4, 5] and softmax_encoder.layers is None
    assert enc.dim == 384 and enc.max_length == 256
    assert "monarch:T=2,B=8@3,4,5" in repr(enc)
    assert enc.encode([]).shape == (0, 384)


def test_python_errors_name_the_argument(softmax_encoder):
    load, enc = strata.SentenceEncoder.load, softmax_encoder
    assert_raises_naming(TypeError, lambda: enc.encode("one sentence"), "argument 'sentences'")
    assert_raises_naming(TypeError, lambda: enc.encode(["a", 3]), "argument 'sentences[1]'")
    assert_raises_naming(ValueError, lambda: enc.encode(["a"], batch_size=0), "argument 'batch_size'")
    assert_raises_naming(TypeError, lambda: enc.encode(["a"], batch_size=2.0), "argument 'batch_size'")
    assert_raises_naming(TypeError, lambda: enc.encode(["a"], progress="yes"), "argument 'progress'")
    assert_raises_naming(ValueError, lambda: enc.encode(["ok", "a\udcff"]), "argument 'sentences[1]'")  # a lone surrogate
    assert_raises_naming(TypeError, lambda: load(spec=3), "argument 'spec'")
    assert_raises_naming(TypeError, lambda: load(layers=[1.5]), "argument 'layers[0]'")
    assert_raises_naming(TypeError, lambda: load(model_dir=3), "argument 'model_dir'")
    assert_raises_naming(RuntimeError, lambda: load(spec="monarch:T=0"), "argument 'spec'")
    assert_raises_naming(RuntimeError, lambda: load(spec="monarch:T=0"), "key 'T'")
    assert_raises_naming(RuntimeError, lambda: load(spec="monarch@1", layers=[2]), "argument 'spec' with 'layers'")
    assert_raises_naming(RuntimeError, lambda: load(spec="monarch", layers=[6]), "argument 'layers'")
    assert_raises_naming(RuntimeError, lambda: load(max_length=513), "argument 'max_length'")
    assert_raises_naming(RuntimeError, lambda: load(model_dir="/nonexistent"), "argument 'model_dir'")


def test_cli_errors_name_the_argument(softmax_encoder, tmp_path):
    def error(*args: str, stdin: bytes = b"x\n", env=None) -> str:
        proc = subprocess.run([str(cli_path()), "embed", *args], input=stdin, capture_output=True, timeout=120,
                              env=env)
        assert proc.returncode != 0 and proc.stdout == b"", proc.stderr.decode()
        return proc.stderr.decode()

    assert "argument '--method'" in error("--method", "monarch:T=0")
    assert "argument '--method' with '--layers'" in error("--method", "monarch@1", "--layers", "2")
    assert "argument '--input'" in error(stdin=b"")
    assert "argument '--input'" in error("--input", str(tmp_path / "missing.txt"))
    assert "argument '--output'" in error("--output", "/dev/null/e.npy")
    assert "--format" in error("--format", "csv")
    assert "--batch-size" in error("--batch-size", "0")
    assert "text 2 of 3" in error(stdin=b"ok\n\xff bad UTF-8\nok\n") and "valid UTF-8" in error(stdin=b"\xff\n")
    assert "setup_encoder.sh" in error(env={**os.environ, "STRATA_MINILM_DIR": str(tmp_path / "none")})
    assert not (tmp_path / "none").exists()
