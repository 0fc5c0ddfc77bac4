"""The fused MoE's pair alignment: torch ``moe_align`` (~40 small kernels) vs
``moe_align_triton`` (three launches), at DeepSeek-V2-Lite's routing (64 experts, top-6)
and V3's (256, top-8), decode and prefill token counts. Decode sizes (<= 1,024 tokens) are
timed replayed from a CUDA graph, as the engine runs them; larger ones eagerly. Both
outputs are compared on every size (exact equality: the same stable order).

    python3 benchmarks/moe_align_bench.py [--tokens 1 64 256 1024 8192] [--json OUT]
    python3 benchmarks/moe_align_bench.py --device cpu --tokens 3 40 --iters 1   # smoke (interpreter)
"""
from __future__ import annotations

import argparse
import sys

import torch

from core_runner.bench.timing import time_ms
from core_runner.bench.variants import write_json
from core_runner.kernels.fused_moe_triton import gemm_config, moe_align
from core_runner.kernels.moe_align_triton import moe_align_triton

ROUTINGS = {"v2-lite": (64, 6), "v3": (256, 8)}
GRAPH_MAX_TOKENS = 1024


def measure(routing: str, tokens: int, device: str, iters: int) -> dict:
    experts, top_k = ROUTINGS[routing]
    g = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(device)
    block_m = gemm_config(tokens * top_k, torch.device(device), num_experts=experts)["BLOCK_M"]
    want, got = moe_align(ids, experts, block_m), moe_align_triton(ids, experts, block_m)
    same = bool(torch.equal(want[0], got[0]) and torch.equal(want[1], got[1]))
    cuda = device.startswith("cuda")
    graph = cuda and tokens <= GRAPH_MAX_TOKENS
    t_torch = 1e3 * time_ms(lambda: moe_align(ids, experts, block_m), iters=iters, graph=graph, cuda=cuda)
    t_triton = 1e3 * time_ms(lambda: moe_align_triton(ids, experts, block_m), iters=iters, graph=graph, cuda=cuda)
    return {"routing": routing, "tokens": tokens, "block_m": block_m, "equal": same, "torch_us": t_torch,
            "triton_us": t_triton, "speedup": t_torch / t_triton, "from_graph": graph}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 256, 1024, 8192])
    ap.add_argument("--routings", nargs="+", default=list(ROUTINGS), choices=list(ROUTINGS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rows = []
    for routing in a.routings:
        for t in a.tokens:
            r = measure(routing, t, a.device, a.iters)
            rows.append(r)
            print(f"moe_align {routing:7s} T={t:5d} (BLOCK_M {r['block_m']:3d}): torch {r['torch_us']:8.1f} us, "
                  f"triton {r['triton_us']:8.1f} us ({r['speedup']:.2f}x){'' if r['equal'] else '  OUTPUTS DIFFER'}"
                  f"{' [graph]' if r['from_graph'] else ''}", flush=True)
    return write_json(a.json, rows)


if __name__ == "__main__":
    main()
    sys.exit(0)
