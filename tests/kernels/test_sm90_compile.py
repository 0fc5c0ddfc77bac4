"""The sampler's kernels, split MLA attention, the fused MoE (biases, swigluoai; fp8) and paged attention over an fp8
cache (fp16 products) compile for sm90 (H100/H200)
on a machine without a GPU: a kernel the GPU compiler rejects fails here, not in a device
call. The interpreter never compiles, so this runs ``sm90_compile.py`` in a process
without TRITON_INTERPRET."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CASES = ["gumbel", "cut_block128_cap128", "cut_bf16", "mla_split", "moe_bias_swigluoai", "moe_fp8",
         "fp8kv_scaled_split"]


def test_sampler_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("sm90_compile.py")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(script), *CASES], env=env, cwd=root, capture_output=True, text=True,
                       timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert r.returncode == 0 and len(lines) == len(CASES), r.stdout + r.stderr[-2000:]
    assert all(ln.startswith("ok") for ln in lines), r.stdout
