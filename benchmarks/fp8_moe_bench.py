"""fp8 vs bf16 fused MoE at DeepSeek-V3's layer: decode sizes from CUDA graphs, prefill eager.

    python benchmarks/fp8_moe_bench.py [--shape v3] [--tokens 1 2 4 ... 256 4096 8192] [--json out.json]

The same random layer twice: bf16 experts through ``fused_moe_triton`` and their fp8
quantization (``quantize_fp8_block``, [128, 128] blocks as DeepSeek-V3's checkpoint)
through ``fused_moe_fp8_triton``, on the same batch (``moe_sweep.make_batch``'s routing).
Token counts up to ``moe_sweep.GRAPH_MAX_TOKENS`` (the engine's largest decode graph) are
timed from a CUDA graph as the engine replays decode steps; larger ones eagerly. Each
row reports both times, the speedup (issue 39's target at decode sizes: >= 1.6x) and the
fp8 output's largest difference from the bf16 one relative to its largest value (the
quantization's error, a few percent; a broken kernel shows up as ~1 or NaN, marked BAD).
The fp8 weights are half the bytes the decode sizes stream, so ~2x is the bound there.

``--config`` (JSON) replaces fp8 tile settings (BLOCK_M / BLOCK_N / num_warps /
num_stages; BLOCK_K is the block's b1) to try tiles by hand. ``tiny`` is the CPU
smoke test's shape (Triton's interpreter, host timer).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.moe_sweep import GRAPH_MAX_TOKENS, SHAPES, MoeShape, make_batch, make_layer
from core_runner.bench.timing import time_ms
from core_runner.kernels.fused_moe_fp8_triton import fp8_gemm_config, fused_moe_fp8_triton
from core_runner.kernels.fused_moe_triton import fused_moe_triton, gemm_config
from core_runner.quantization import quantize_fp8_block

DECODE_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PREFILL_TOKENS = [4096, 8192]
BAD_ERR = 0.2  # of the output's max |value|: far above block quantization's few percent


def quantize_layer(w13: torch.Tensor, w2: torch.Tensor, block: tuple[int, int], chunk: int = 16) -> dict:
    """The experts' fp8 values and block scales, a few experts at a time (the float32
    transient of all 256 of V3's would be 45 GB)."""
    out = {}
    for name, w in (("w13", w13), ("w2", w2)):
        parts = [quantize_fp8_block(w[e:e + chunk], block) for e in range(0, w.shape[0], chunk)]
        out[name] = torch.cat([q for q, _ in parts])
        out[name + "_scale"] = torch.cat([s for _, s in parts])
    return out


def bench_tokens(shape: MoeShape, w13: torch.Tensor, w2: torch.Tensor, fp8: dict, block: tuple[int, int],
                 num_tokens: int, iters: int, warmup: int, config: dict | None = None) -> dict:
    hidden, weights, ids = make_batch(shape, num_tokens, str(w13.device), w13.dtype)
    cuda = w13.is_cuda
    graph = cuda and num_tokens <= GRAPH_MAX_TOKENS

    def bf16():
        return fused_moe_triton(hidden, w13, w2, weights, ids)

    def fp8_call():
        return fused_moe_fp8_triton(hidden, fp8["w13"], fp8["w13_scale"], fp8["w2"], fp8["w2_scale"], block,
                                    weights, ids, config=config)

    ref, out = bf16().float(), fp8_call().float()
    err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    bf16_ms = time_ms(bf16, iters=iters, warmup=warmup, graph=graph, cuda=cuda)
    fp8_ms = time_ms(fp8_call, iters=iters, warmup=warmup, graph=graph, cuda=cuda)
    pairs = num_tokens * shape.top_k
    touched = int(torch.unique(ids).numel())
    return {
        "tokens": num_tokens, "pairs": pairs, "experts_touched": touched, "graph": graph,
        "bf16_ms": bf16_ms, "fp8_ms": fp8_ms, "speedup": bf16_ms / fp8_ms, "rel_err_vs_bf16": err,
        "ok": bool(err <= BAD_ERR),  # NaN is not ok
        "bf16_config": gemm_config(pairs, w13.device, num_experts=shape.experts, elem_bytes=w13.element_size()),
        "fp8_config": fp8_gemm_config(pairs, w13.device, block, None, config, num_experts=shape.experts),
        "fp8_weight_gb_s": touched * 3 * shape.inter * shape.hidden / (fp8_ms * 1e-3) / 1e9,
    }


def format_row(r: dict) -> str:
    return (f"T={r['tokens']:<5} {'graph' if r['graph'] else 'eager'}  bf16 {r['bf16_ms']:8.3f} ms  fp8 "
            f"{r['fp8_ms']:8.3f} ms  {r['speedup']:5.2f}x  err {r['rel_err_vs_bf16']:.3f}"
            f"{'' if r['ok'] else '  BAD'}  ({r['experts_touched']} experts, fp8 {r['fp8_weight_gb_s']:.0f} GB/s)")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="v3")
    ap.add_argument("--tokens", type=int, nargs="+", default=DECODE_TOKENS + PREFILL_TOKENS)
    ap.add_argument("--block", type=int, nargs=2, default=[128, 128], help="weight_block_size [b0, b1]")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--config", type=json.loads, default=None, help="fp8 tile overrides, JSON")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    shape, block = SHAPES[args.shape], tuple(args.block)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    if args.device.startswith("cuda"):
        need = shape.experts * 3 * shape.inter * shape.hidden * 3  # bf16 + fp8 weights
        free = torch.cuda.mem_get_info(torch.device(args.device))[0]
        if need > 0.85 * free:
            raise SystemExit(f"--shape {args.shape} needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB are free")
    start = time.perf_counter()
    w13, w2 = make_layer(shape, args.device, dtype)
    fp8 = quantize_layer(w13, w2, block)
    results = []
    for t in args.tokens:
        results.append(bench_tokens(shape, w13, w2, fp8, block, t, args.iters, args.warmup, args.config))
        print(format_row(results[-1]), flush=True)
    import triton

    report = {"shape": args.shape, "experts": shape.experts, "inter": shape.inter, "hidden": shape.hidden,
              "top_k": shape.top_k, "block": list(block), "dtype": str(dtype).removeprefix("torch."),
              "device": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "iters": args.iters,
              "elapsed_s": time.perf_counter() - start, "results": results}
    print(f"fp8 MoE bench took {report['elapsed_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
