"""benchmarks/fp8_moe_bench.py on the CPU (Triton's interpreter): a tiny layer runs both
paths at a decode and a prefill size, reports both times and an fp8 output close to the
bf16 kernel's, and a kernel whose output is wrong is flagged rather than reported fast."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def bench():
    """Imported with TRITON_INTERPRET=1 on a CPU-only machine (Triton picks the interpreter
    when a kernel is decorated; the kernels may already be, by another test: both ways run)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield importlib.import_module("benchmarks.fp8_moe_bench")


def test_tiny_bench_reports_both_paths(bench, tmp_path):
    path = tmp_path / "fp8_moe.json"
    # the tiny shape's intermediate 24 splits into 8-row blocks; K blocks of 16 (float32 dot)
    bench.main(["--shape", "tiny", "--device", DEVICE, "--block", "8", "16", "--tokens", "3", "40", "--iters", "1",
                "--warmup", "0", "--json", str(path)])
    report = json.loads(path.read_text())
    assert report["block"] == [8, 16] and [r["tokens"] for r in report["results"]] == [3, 40]
    for r in report["results"]:
        assert r["ok"] and 0 < r["rel_err_vs_bf16"] < 0.1, r  # quantized, so not equal; close
        assert r["bf16_ms"] > 0 and r["fp8_ms"] > 0 and r["fp8_config"]["BLOCK_K"] == 16


def test_wrong_fp8_output_is_flagged(bench, monkeypatch):
    shape = bench.SHAPES["tiny"]
    w13, w2 = bench.make_layer(shape, DEVICE, torch.float32)
    fp8 = bench.quantize_layer(w13, w2, (8, 16))
    fp8["w2_scale"] = fp8["w2_scale"] * 4  # every down product 4x too large
    r = bench.bench_tokens(shape, w13, w2, fp8, (8, 16), 5, iters=1, warmup=0)
    assert not r["ok"] and "BAD" in bench.format_row(r)
