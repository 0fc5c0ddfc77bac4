"""benchmarks/moe_sweep.py: its config grids stay small, a tiny sweep runs (Triton's
interpreter on a CPU-only machine) and reports results equal to the torch reference, and a
config whose output is wrong, or that fails, is never the best however fast."""
from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

import pytest
import torch

from core_runner.layers.fused_moe import fused_moe_ref

ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def sweep():
    """The module, imported with TRITON_INTERPRET=1 on a CPU-only machine: Triton picks the
    interpreter when the kernel is decorated (as tests/kernels/conftest.py does)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    with pytest.MonkeyPatch.context() as mp:
        if DEVICE == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        yield importlib.import_module("benchmarks.moe_sweep")


@pytest.mark.parametrize("shape", ["v2-lite", "v3"])
@pytest.mark.parametrize("tokens", [256, 1024, 8192])
def test_config_grids_stay_small(sweep, shape, tokens):
    from core_runner.kernels.fused_moe_triton import GEMM_CONFIG_KEYS

    s = sweep.SHAPES[shape]
    tiles = sweep.tile_grid(s, tokens)
    rows = tokens * s.top_k / s.experts
    assert tiles and all(t["BLOCK_M"] <= max(16, 2 * rows) for t in tiles)
    launches = [sweep.launch_grid(t) for t in tiles]
    assert len(tiles) + sweep.STAGE2_TILES * max(map(len, launches)) + 1 <= 40
    for tile, around in zip(tiles, launches):
        assert tile not in around
        for cfg in [tile, *around]:
            assert tuple(cfg) == GEMM_CONFIG_KEYS and sweep._fits_smem(cfg, 2)
    if shape == "v2-lite" and tokens == 8192:
        assert {t["BLOCK_M"] for t in tiles} == {16, 32, 64, 128}


def test_tiny_sweep_equals_the_reference(sweep, tmp_path):
    from core_runner.kernels.fused_moe_triton import fused_moe_triton

    path = tmp_path / "sweep.json"
    sweep.main(["--shape", "tiny", "--device", DEVICE, "--tokens", "24", "--iters", "1", "--warmup", "0",
                "--fuse-activation", "--json", str(path)])
    report = json.loads(path.read_text())
    assert report["shape"] == "tiny" and report["experts"] == 4
    (res,) = report["results"]
    for key in ("default_ms", "default_config", "best_config", "best_ms", "best_weight_gb_s", "best_tflop_s",
                "default_ref_err", "experts_touched", "configs"):
        assert res[key] is not None, key
    tol = report["tolerance"]
    assert res["default_ref_err"] <= tol
    assert res["num_configs"] == len(res["configs"]) > 10 and res["num_wrong"] == res["num_failed"] == 0
    assert all(r["ok"] and r["max_err"] <= tol and r["ms"] > 0 for r in res["configs"])
    assert res["best_ms"] == min(r["ms"] for r in res["configs"])
    assert any(r.get("fused") for r in res["configs"])  # the real fused kernel, checked like the rest
    # the chosen config, run again on the same batch, gives the reference's sum
    s = sweep.SHAPES["tiny"]
    dtype = getattr(torch, report["dtype"])
    w13, w2 = sweep.make_layer(s, DEVICE, dtype)
    hidden, weights, ids = sweep.make_batch(s, 24, DEVICE, dtype)
    out = fused_moe_triton(hidden, w13, w2, weights, ids, config=res["best_config"],
                           fuse_activation=res["best_fused"])
    ref = fused_moe_ref(hidden.float(), w13.float(), w2.float(), weights, ids)
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() <= max(tol, 1e-5)


def test_wrong_or_failing_configs_are_never_best(sweep):
    """A stand-in kernel: BLOCK_K=64 returns a wrong sum at once (the fastest), BLOCK_N=128 with
    BLOCK_K=128 fails as an out-of-resources launch would; the rest are right and slower."""
    def moe(hidden, w13, w2, weights, ids, config=None):
        out = fused_moe_ref(hidden, w13, w2, weights, ids)
        if config and config["BLOCK_K"] == 64:
            return out + 0.5
        if config and (config["BLOCK_N"], config["BLOCK_K"]) == (128, 128):
            raise RuntimeError("out of resources: shared memory")
        time.sleep(0.002)
        return out

    s = sweep.SHAPES["tiny"]
    w13, w2 = sweep.make_layer(s, "cpu", torch.float32)
    res = sweep.sweep_tokens(s, w13, w2, 24, warmup=0, iters=1, moe=moe)
    wrong = [r for r in res["configs"] if r["config"]["BLOCK_K"] == 64]
    failed = [r for r in res["configs"] if "error" in r]
    assert wrong and all(not r["ok"] and r["ms"] < res["best_ms"] for r in wrong)
    assert failed and all("out of resources" in r["error"] and not r["ok"] for r in failed)
    assert res["num_wrong"] == len(wrong) and res["num_failed"] == len(failed)
    assert res["best_config"]["BLOCK_K"] != 64
    assert res["best_config"] in [r["config"] for r in res["configs"] if r["ok"]]


def test_fused_stage_runs_the_best_tiles_with_the_activation_in_the_epilogue(sweep, tmp_path):
    """--fuse-activation: the best two tiles again with fuse_activation (and at half BLOCK_N),
    each checked against the default like every other run; the best may be a fused one."""
    calls = []

    def moe(hidden, w13, w2, weights, ids, config=None, fuse_activation=False):
        calls.append((dict(config or {}), fuse_activation))
        if fuse_activation:  # the fused kernel is the fastest here, and right
            return fused_moe_ref(hidden, w13, w2, weights, ids)
        # the two best tiles differ in BLOCK_N only, so the half of one is the other
        best = config and (config["BLOCK_K"], config["num_warps"], config["num_stages"]) == (64, 4, 3)
        time.sleep(0.001 if best and config["BLOCK_N"] in (64, 128) else 0.004)
        return fused_moe_ref(hidden, w13, w2, weights, ids)

    s = sweep.SHAPES["tiny"]
    w13, w2 = sweep.make_layer(s, "cpu", torch.float32)
    res = sweep.sweep_tokens(s, w13, w2, 24, warmup=0, iters=1, moe=moe, fuse=True)
    fused = [r for r in res["configs"] if r.get("fused")]
    assert fused and all(r["stage"] == "fused" and r["ok"] for r in fused)
    plain = sorted((r for r in res["configs"] if r["ok"] and not r.get("fused")), key=lambda r: r["ms"])
    want = [c for r in plain[:sweep.STAGE2_TILES] for c in sweep.fused_grid(r["config"])]
    # one run per fused config: N128's half is the N64 tile, run once
    assert sorted(map(str, (r["config"] for r in fused))) == sorted(set(map(str, want)))
    assert sorted(r["config"]["BLOCK_N"] for r in fused) == [32, 64, 128]
    assert any(c["BLOCK_N"] * 2 == p["config"]["BLOCK_N"] for c in want for p in plain[:sweep.STAGE2_TILES])
    assert {str(cfg) for cfg, f in calls if f} == {str(r["config"]) for r in fused}
    assert res["best_fused"] and res["best_config"] in [r["config"] for r in fused]
    assert "fused" in sweep.format_result(res)
    unfused = sweep.sweep_tokens(s, w13, w2, 24, warmup=0, iters=1, moe=moe)
    assert not any(r.get("fused") for r in unfused["configs"]) and unfused["best_fused"] is False
