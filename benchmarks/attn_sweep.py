"""Paged attention at the shapes of the Qwen3-0.6B benchmark steps, over launch choices.

Each shape is one layer's attention call (16 q / 8 kv heads, head 128, block 16, bf16)
as a W1 / W2 step issues it; every variant is timed with CUDA events and checked against
the default variant's output (a fast wrong variant is marked, never chosen). Decode
shapes are timed as the engine runs them, replayed from a CUDA graph (eager, a short call
measures the host's launch cost: ~40 us a Triton launch), with the bounds a decode graph
bakes in (max_seq_len = 2048, the bench's max_model_len); prefill shapes eagerly, back to
back. Decode shapes report KV bandwidth, prefill shapes TFLOP/s.

    python3 benchmarks/attn_sweep.py [--json PATH] [--shapes decode_w1 ...]
"""
from __future__ import annotations

import argparse
import json
import random

import torch

from core_runner.bench.timing import time_ms
from core_runner.kernels.paged_attention_triton import paged_attention_triton

HEADS, KV_HEADS, D, BLOCK = 16, 8, 128, 16


def _shape(name: str, rng: random.Random) -> list[tuple[int, int]]:
    """(q_len, seq_len) per request, decode rows first as the runner orders them."""
    if name == "decode_w1":  # W1 at step 100: 1024 requests, 128-token prompts, ~92 out
        return [(1, 128 + 92 - rng.randrange(16)) for _ in range(1024)]
    if name == "decode_w2":  # W2 at step 100: prompts U[100, 1024] + ~82 out
        return [(1, rng.randint(100, 1024) + 82) for _ in range(256)]
    if name == "decode_w2_tail":  # W2 late: 40 long requests left
        return [(1, rng.randint(1200, 2048)) for _ in range(40)]
    if name == "mixed_w1":  # a W1 prefill step: 480 decodes + 64 fresh 128-token prompts
        return [(1, 130 + rng.randrange(16)) for _ in range(480)] + [(128, 128)] * 64
    if name == "prefill_w2":  # a W2 prefill step: fresh prompts U[100, 1024] up to 8192 tokens
        reqs, left = [], 8192
        while left > 0:
            n = min(rng.randint(100, 1024), left)
            reqs.append((n, n))
            left -= n
        return reqs
    if name == "prefill_1x8192":
        return [(8192, 8192)]
    raise ValueError(f"unknown shape {name!r}")


SHAPES = ("decode_w1", "decode_w2", "decode_w2_tail", "mixed_w1", "prefill_w2", "prefill_1x8192")


def _variants(name: str) -> list[dict]:
    """The default first, then launch choices for this kind of shape (a short list: each
    distinct choice is a Triton compile of a few seconds)."""
    out = [{}]
    if name.startswith("decode"):
        for bn, st in ((64, 2), (128, 3), (128, 4)):
            out.append({"config": {"BLOCK_N": bn, "num_stages": st, "num_warps": 4}})
        out += [{"num_splits": s} for s in (1, 2, 4, 8)]
    else:
        for bm, bn, w, st in ((64, 128, 4, 2), (64, 64, 8, 2), (64, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2),
                              (128, 32, 8, 2), (128, 64, 4, 2), (128, 64, 8, 3)):
            out.append({"config": {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}})
    return out


def _batch(reqs: list[tuple[int, int]], g: torch.Generator):
    blocks = [-(-s // BLOCK) for _, s in reqs]
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    bt = torch.zeros(len(reqs), max(blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        bt[i, :n] = perm[used:used + n]
        used += n
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor([q for q, _ in reqs]).cumsum(0)
    kv = torch.randn(2, num_blocks, BLOCK, KV_HEADS, D, generator=g).to(torch.bfloat16)
    q = torch.randn(int(qsl[-1]), HEADS, D, generator=g).to(torch.bfloat16)
    lens = torch.tensor([s for _, s in reqs], dtype=torch.int32)
    return [t.cuda() for t in (q, kv, qsl, lens, bt)]


def sweep(name: str, seed: int = 0) -> dict:
    reqs = _shape(name, random.Random(seed))
    q, kv, qsl, lens, bt = _batch(reqs, torch.Generator().manual_seed(seed))
    decode = name.startswith("decode")
    bounds = dict(max_query_len=max(x for x, _ in reqs), max_seq_len=2048 if decode else max(s for _, s in reqs))
    kv_bytes = sum(s for _, s in reqs) * KV_HEADS * D * 2 * 2
    flops = sum(4 * x * (s - x + (x + 1) / 2) * D * HEADS for x, s in reqs)  # causal
    ref = None
    rows = []
    for v in _variants(name):
        fn = lambda v=v: paged_attention_triton(q, kv, qsl, lens, bt, D ** -0.5, **bounds, **v)  # noqa: E731
        try:
            out = fn()
            torch.cuda.synchronize()
        except Exception as e:  # a tile that does not compile or fit is recorded, not fatal
            rows.append({"variant": v, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        if ref is None:
            ref = out.float()
        ok = bool(torch.allclose(out.float(), ref, atol=3e-2, rtol=3e-2))
        us = 1e3 * time_ms(fn, iters=30, graph=decode)
        rows.append({"variant": v, "us": us, "ok": ok, "kv_gb_s": kv_bytes / us / 1e3,
                     "tflop_s": flops / us / 1e6})
    good = [r for r in rows if r.get("ok")]
    best = min(good, key=lambda r: r["us"])
    res = {"shape": name, "num_reqs": len(reqs), "num_tokens": int(q.shape[0]), "kv_mb": kv_bytes / 1e6,
           "gflop": flops / 1e9, "default": rows[0], "best": best, "rows": rows}
    d, b = rows[0], best
    print(f"{name:16s} default {d['us']:8.1f} us ({d['kv_gb_s']:6.0f} GB/s, {d['tflop_s']:5.0f} TF/s)  "
          f"best {b['us']:8.1f} us ({b['kv_gb_s']:6.0f} GB/s, {b['tflop_s']:5.0f} TF/s) {b['variant']}", flush=True)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    found = {name: sweep(name) for name in args.shapes}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
