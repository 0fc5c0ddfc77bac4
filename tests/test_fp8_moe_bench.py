"""benchmarks/fp8_moe_bench.py on the CPU (Triton's interpreter): a tiny layer runs both
paths at a decode and a prefill size, reports both times and an fp8 output close to the
bf16 kernel's, and a kernel whose output is wrong is flagged rather than reported fast.

Each runs in its own process with TRITON_INTERPRET=1 set before any kernel is decorated:
in this process an earlier test may already have imported the kernels compiled, and a
kernel interpreted there cannot call a helper decorated before (the fp8 rounding)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_tiny_bench_reports_both_paths(tmp_path):
    path = tmp_path / "fp8_moe.json"
    # the tiny shape's intermediate 24 splits into 8-row blocks; K blocks of 16 (float32 dot)
    r = _python("benchmarks/fp8_moe_bench.py", "--shape", "tiny", "--device", DEVICE, "--block", "8", "16",
                "--tokens", "3", "40", "--iters", "1", "--warmup", "0", "--json", str(path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(path.read_text())
    assert report["block"] == [8, 16] and [r["tokens"] for r in report["results"]] == [3, 40]
    for row in report["results"]:
        assert row["ok"] and 0 < row["rel_err_vs_bf16"] < 0.1, row  # quantized, so not equal; close
        assert row["bf16_ms"] > 0 and row["fp8_ms"] > 0 and row["fp8_config"]["BLOCK_K"] == 16
    assert "T=40" in r.stdout and "BAD" not in r.stdout


WRONG = f"""
import torch
from benchmarks import fp8_moe_bench as b
shape = b.SHAPES["tiny"]
w13, w2 = b.make_layer(shape, "{DEVICE}", torch.float32)
fp8 = b.quantize_layer(w13, w2, (8, 16))
fp8["w2_scale"] = fp8["w2_scale"] * 4  # every down product 4x too large
r = b.bench_tokens(shape, w13, w2, fp8, (8, 16), 5, iters=1, warmup=0)
print(r["ok"], "BAD" in b.format_row(r), r["rel_err_vs_bf16"])
"""


def test_wrong_fp8_output_is_flagged():
    r = _python("-c", WRONG)
    assert r.returncode == 0, r.stderr[-3000:]
    ok, flagged, err = r.stdout.split()[-3:]
    assert ok == "False" and flagged == "True" and float(err) > 1, r.stdout
