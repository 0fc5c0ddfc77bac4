"""benchmarks/attn_sweep.py on one request (the interpreter on CPU): the fp8 run times the
bf16 default beside its own variants, and every variant agrees with the default."""
import importlib.util
from pathlib import Path

import pytest


def _sweep_module():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "attn_sweep.py"
    spec = importlib.util.spec_from_file_location("attn_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("shape", ["decode_w1", "decode_gemma3_local"])
def test_fp8_sweep_reports_the_bf16_default(device, shape):
    mod = _sweep_module()
    res = mod.sweep(shape, kv_dtype="fp8", device=device, iters=1, max_reqs=1, max_variants=2)
    assert res["kv_dtype"] == "fp8" and len(res["rows"]) == 2
    assert all(r["ok"] for r in res["rows"]), res["rows"]
    assert res["bf16_default"]["variant"] == {"bf16": True} and res["bf16_default"]["us"] > 0
    heads, window, _ = mod.geometry(shape)
    assert (window is not None) == shape.endswith("_local")
    # fp8 reads one byte a value: the reported bandwidth counts half the bf16 bytes
    ctx = min(mod._shape(shape, __import__("random").Random(0))[0][1], window or 10**9)
    assert res["kv_mb"] * 1e6 == ctx * heads[1] * heads[2] * 2
