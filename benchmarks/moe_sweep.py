"""Tile sweep of the fused MoE grouped GEMM (``fused_moe_triton``) at a DeepSeek MoE layer.

    python benchmarks/moe_sweep.py [--shape v2-lite|v3] [--tokens 256 1024 8192] [--fuse-activation]
                                   [--json out.json]

Shapes: ``v2-lite`` (64 experts of 1408, hidden 2048, top-6) and ``v3`` (256 experts of 2048,
hidden 7168, top-8: 22.5 GB of bf16 weights, allocated in full so that the experts a batch
touches are as spread in memory as in the real layer); ``tiny`` is the CPU smoke test's.
Routing is greedy top-k of a softmax over random logits (V2-Lite's; V3's sigmoid and groups
change which experts are picked, not how many rows each gets on random logits).

For each token count: the default tiles, then every tile (BLOCK_M up to twice the rows an
expert gets on average, BLOCK_N 64/128, BLOCK_K 32/64/128) at 4 warps, then warps 4/8 x
stages 2/3/4 around the best two tiles: ~35 configs, not the ~150 of the full product,
because the Triton compiles (two per config) are most of the sweep's time. With
``--fuse-activation``, the best two are run again with silu(gate) * up in the first GEMM's
epilogue (``fuse_activation``), at their BLOCK_N and at half of it (two accumulators hold
twice the columns' registers); a fused run's record says ``"fused": true``. Each config's
output is compared with the default's (the default's own first rows with ``fused_moe_ref``):
one that differs is marked wrong and is never the best, however fast. A config that fails
to compile or launch is recorded with its error. Times are CUDA events around ``--iters``
back-to-back calls after ``--warmup`` calls (host timer on the CPU); bandwidth counts the
weights of the experts the routing touched, once per call.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from core_runner.bench.timing import time_ms
from core_runner.kernels.fused_moe_triton import fused_moe_triton, gemm_config
from core_runner.layers.fused_moe import fused_moe_ref


@dataclass(frozen=True)
class MoeShape:
    experts: int
    inter: int  # moe_intermediate_size
    hidden: int
    top_k: int


SHAPES = {
    "v2-lite": MoeShape(64, 1408, 2048, 6),
    "v3": MoeShape(256, 2048, 7168, 8),
    "tiny": MoeShape(4, 24, 32, 2),  # CPU smoke test under TRITON_INTERPRET=1
}
TILE_M, TILE_N, TILE_K = (16, 32, 64, 128), (64, 128), (32, 64, 128)
WARPS, STAGES = (4, 8), (2, 3, 4)
SMEM_BYTES = 200 * 1024  # below an H200's 227 KB per block: the epilogue needs some too
STAGE2_TILES = 2
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}  # of the output's max |value|
REF_ROWS = 64


def _fits_smem(cfg: dict, elem_bytes: int) -> bool:
    per_stage = (cfg["BLOCK_M"] * cfg["BLOCK_K"] + cfg["BLOCK_K"] * cfg["BLOCK_N"]) * elem_bytes
    return per_stage * cfg["num_stages"] <= SMEM_BYTES


def tile_grid(shape: MoeShape, num_tokens: int, elem_bytes: int = 2) -> list[dict]:
    """Stage 1: every tile whose BLOCK_M is at most twice the rows an expert gets on average
    (16 always), at 4 warps and 3 stages (fewer where shared memory is short)."""
    rows = num_tokens * shape.top_k / shape.experts
    out = []
    for bm in [m for m in TILE_M if m <= max(16, 2 * rows)]:
        for bn in TILE_N:
            for bk in TILE_K:
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4, "num_stages": 3}
                while cfg["num_stages"] > 1 and not _fits_smem(cfg, elem_bytes):
                    cfg["num_stages"] -= 1
                out.append(cfg)
    return out


def launch_grid(tile: dict, elem_bytes: int = 2) -> list[dict]:
    """Stage 2: the tile at every warps x stages that fits shared memory, itself left out."""
    out = [{**tile, "num_warps": w, "num_stages": s} for w in WARPS for s in STAGES]
    return [c for c in out if c != tile and _fits_smem(c, elem_bytes)]


def make_layer(shape: MoeShape, device: str, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random expert weights (w13 [E, 2I, H], w2 [E, H, I]) with unit-variance outputs."""
    g = torch.Generator(device=device).manual_seed(seed)
    e, i, h = shape.experts, shape.inter, shape.hidden
    w13 = torch.randn(e, 2 * i, h, generator=g, device=device, dtype=dtype).mul_(h ** -0.5)
    w2 = torch.randn(e, h, i, generator=g, device=device, dtype=dtype).mul_(i ** -0.5)
    return w13, w2


def make_batch(shape: MoeShape, num_tokens: int, device: str, dtype: torch.dtype, seed: int = 1):
    g = torch.Generator(device=device).manual_seed(seed + num_tokens)
    hidden = torch.randn(num_tokens, shape.hidden, generator=g, device=device, dtype=dtype)
    probs = torch.randn(num_tokens, shape.experts, generator=g, device=device).softmax(dim=-1)
    weights, ids = probs.topk(shape.top_k, dim=-1)
    return hidden, weights, ids.to(torch.int32)


GRAPH_MAX_TOKENS = 1024  # the engine's largest decode graph: smaller calls are timed from a graph


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.float()
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def fused_grid(tile: dict) -> list[dict]:
    """Stage 3 (``--fuse-activation``): the tile and the tile with half its BLOCK_N (at least 16)."""
    half = {**tile, "BLOCK_N": max(16, tile["BLOCK_N"] // 2)}
    return [tile] if half == tile else [tile, half]


def sweep_tokens(shape: MoeShape, w13: torch.Tensor, w2: torch.Tensor, num_tokens: int, warmup: int = 3,
                 iters: int = 20, moe: Callable = fused_moe_triton, fuse: bool = False) -> dict:
    """One token count: the default, stage 1 and stage 2 timed and checked (module docstring)."""
    hidden, weights, ids = make_batch(shape, num_tokens, str(w13.device), w13.dtype)
    cuda = w13.is_cuda
    tol = TOLERANCE[w13.dtype]
    default = gemm_config(num_tokens * shape.top_k, w13.device, num_experts=shape.experts,
                          elem_bytes=w13.element_size())
    ref = moe(hidden, w13, w2, weights, ids)
    n = min(num_tokens, REF_ROWS)
    ref_err = _rel_err(ref[:n], fused_moe_ref(hidden[:n], w13, w2, weights[:n], ids[:n]))
    runs: list[dict] = []

    def run(cfg: dict, stage: str) -> None:
        fused = stage == "fused"
        if any(r["config"] == cfg and r.get("fused", False) == fused for r in runs):
            return
        rec: dict = {"config": cfg, "stage": stage, **({"fused": True} if fused else {})}
        extra = {"fuse_activation": True} if fused else {}
        try:
            call = (lambda: moe(hidden, w13, w2, weights, ids, config=cfg, **extra)) if stage != "default" else \
                (lambda: moe(hidden, w13, w2, weights, ids))
            rec["max_err"] = _rel_err(call(), ref)
            rec["ok"] = bool(rec["max_err"] <= tol)  # NaN is not ok
            rec["ms"] = time_ms(call, iters=iters, warmup=warmup, graph=cuda and num_tokens <= GRAPH_MAX_TOKENS,
                                cuda=cuda)
        except Exception as exc:  # a config that does not compile or launch (shared memory, registers)
            rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        runs.append(rec)

    run(default, "default")
    elem = w13.element_size()
    for cfg in tile_grid(shape, num_tokens, elem):
        run(cfg, "tile")
    good = sorted((r for r in runs if r["ok"]), key=lambda r: r["ms"])
    for best_tile in [r["config"] for r in good[:STAGE2_TILES]]:
        for cfg in launch_grid(best_tile, elem):
            run(cfg, "launch")
    if fuse:
        good = sorted((r for r in runs if r["ok"]), key=lambda r: r["ms"])
        for best in [r["config"] for r in good[:STAGE2_TILES]]:
            for cfg in fused_grid(best):
                run(cfg, "fused")
    return summarize(shape, num_tokens, ids, elem, runs, default, ref_err, tol)


def summarize(shape: MoeShape, num_tokens: int, ids: torch.Tensor, elem: int, runs: list[dict], default: dict,
              ref_err: float, tol: float) -> dict:
    touched = int(torch.unique(ids).numel())
    weight_bytes = touched * 3 * shape.inter * shape.hidden * elem  # gate, up and down of each touched expert
    flops = 2 * num_tokens * shape.top_k * 3 * shape.inter * shape.hidden

    def rate(ms: float) -> dict:
        return {"weight_gb_s": weight_bytes / (ms * 1e-3) / 1e9, "tflop_s": flops / (ms * 1e-3) / 1e12}

    for r in runs:
        if "ms" in r:
            r.update(rate(r["ms"]))
    base = runs[0]
    # a default that is wrong (or whose output equals no reference) leaves nothing to trust
    good = sorted((r for r in runs if r["ok"]), key=lambda r: r["ms"]) if ref_err <= tol and base["ok"] else []
    best = good[0] if good else None
    return {
        "tokens": num_tokens, "pairs": num_tokens * shape.top_k, "experts_touched": touched,
        "weight_bytes_touched": weight_bytes, "flops": flops, "default_config": default,
        "default_ms": base.get("ms"), "default_ref_err": ref_err, "default_weight_gb_s": base.get("weight_gb_s"),
        "default_tflop_s": base.get("tflop_s"),
        "best_config": best["config"] if best else None, "best_fused": bool(best and best.get("fused")),
        "best_ms": best["ms"] if best else None,
        "best_weight_gb_s": best["weight_gb_s"] if best else None, "best_tflop_s": best["tflop_s"] if best else None,
        "speedup": base["ms"] / best["ms"] if best and base.get("ms") else None,
        "num_configs": len(runs), "num_wrong": sum("error" not in r and not r["ok"] for r in runs),
        "num_failed": sum("error" in r for r in runs), "configs": runs,
    }


def _name(cfg: dict, fused: bool = False) -> str:
    name = f"M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} K{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"
    return name + " fused" if fused else name


def format_result(res: dict) -> str:
    lines = [f"T={res['tokens']} ({res['pairs']} pairs, {res['experts_touched']} experts touched, "
             f"{res['weight_bytes_touched'] / 1e9:.2f} GB of weights, {res['flops'] / 1e12:.2f} TFLOP)",
             f"  {'config':<30} {'stage':<8} {'ms':>8} {'GB/s':>8} {'TFLOP/s':>8}  status"]
    for r in sorted(res["configs"], key=lambda r: r.get("ms", float("inf"))):
        status = "ok" if r["ok"] else r.get("error", f"WRONG (err {r.get('max_err', float('nan')):.2g})")
        ms = f"{r['ms']:8.3f} {r['weight_gb_s']:8.0f} {r['tflop_s']:8.1f}" if "ms" in r else f"{'-':>8} " * 3
        lines.append(f"  {_name(r['config'], r.get('fused', False)):<30} {r['stage']:<8} {ms}  {status[:100]}")
    if res["best_config"]:
        lines.append(f"  default {_name(res['default_config'])} {res['default_ms']:.3f} ms -> best "
                     f"{_name(res['best_config'], res['best_fused'])} {res['best_ms']:.3f} ms ({res['speedup']:.2f}x)")
    else:
        lines.append(f"  no trusted result: the default's error against fused_moe_ref is {res['default_ref_err']:.3g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="v2-lite")
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 8192])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                    help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--fuse-activation", action="store_true",
                    help="also time the best two configs with silu(gate) * up in the first GEMM's epilogue")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    elem = torch.empty(0, dtype=dtype).element_size()
    if args.device.startswith("cuda"):
        # weights plus the largest batch's hidden, gate_up, act, down and output rows
        t = max(args.tokens)
        need = elem * (shape.experts * 3 * shape.inter * shape.hidden
                       + t * shape.top_k * (3 * shape.inter + shape.hidden) + 3 * t * shape.hidden)
        free = torch.cuda.mem_get_info(torch.device(args.device))[0]
        if need > 0.9 * free:
            raise SystemExit(f"--shape {args.shape} needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB are free")
    start = time.perf_counter()
    w13, w2 = make_layer(shape, args.device, dtype)
    results = []
    for t in args.tokens:
        results.append(sweep_tokens(shape, w13, w2, t, args.warmup, args.iters, fuse=args.fuse_activation))
        print(format_result(results[-1]), flush=True)
    import triton

    report = {"shape": args.shape, **asdict(shape), "dtype": str(dtype).removeprefix("torch."),
              "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "warmup": args.warmup, "iters": args.iters,
              "tolerance": TOLERANCE[dtype], "elapsed_s": time.perf_counter() - start, "results": results}
    print(f"sweep took {report['elapsed_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
