"""Paged attention at the shapes of the benchmark steps, over launch choices.

Each shape is one layer's attention call as a step issues it: Qwen3-0.6B's (16 q / 8 kv
heads, head 128) at W1 / W2 steps, and Gemma-3-1B's (4 q / 1 kv head, head 256) decoding
8,192-token contexts, in a global layer and a sliding-window (1,024) one; block 16, the
cache in bf16 or (``--kv-dtype fp8``) float8_e4m3fn, where the bf16 default's time on the
same shape is printed beside it. Every variant is timed with CUDA events and checked against
the default variant's output (a fast wrong variant is marked, never chosen). Decode
shapes are timed as the engine runs them, replayed from a CUDA graph (eager, a short call
measures the host's launch cost: ~40 us a Triton launch), with the bounds a decode graph
bakes in (max_seq_len = 2048, the bench's max_model_len); prefill shapes eagerly, back to
back. Decode shapes report KV bandwidth, prefill shapes TFLOP/s.

    python3 benchmarks/attn_sweep.py [--json PATH] [--shapes decode_w1 ...] [--kv-dtype bf16|fp8]
"""
from __future__ import annotations

import argparse
import random

import torch

from core_runner.bench.timing import time_ms
from core_runner.bench.variants import write_json
from core_runner.kernels.paged_attention_triton import paged_attention_triton

BLOCK = 16
QWEN3, GEMMA3 = (16, 8, 128), (4, 1, 256)  # (q heads, kv heads, head size)
KV_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def geometry(name: str) -> tuple[tuple[int, int, int], int | None, int]:
    """(heads, sliding window, max_seq_len bound a decode graph bakes in) of a shape."""
    if name.startswith("decode_gemma3"):
        return GEMMA3, (1024 if name.endswith("_local") else None), 8192
    return QWEN3, None, 2048


def _shape(name: str, rng: random.Random) -> list[tuple[int, int]]:
    """(q_len, seq_len) per request, decode rows first as the runner orders them."""
    if name.startswith("decode_gemma3"):  # gemma3 bench: 128 requests decoding 8,192-token contexts
        return [(1, 8192 - rng.randrange(256)) for _ in range(128)]
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


SHAPES = ("decode_w1", "decode_w2", "decode_w2_tail", "mixed_w1", "prefill_w2", "prefill_1x8192",
          "decode_gemma3", "decode_gemma3_local")


def _variants(name: str, fp8: bool) -> list[dict]:
    """The default first, then launch choices for this kind of shape (a short list: each
    distinct choice is a Triton compile of a few seconds). Decode tiles are tried with
    more warps and with a register cap too: the fp8 decode kernel needs ~184 registers a
    thread uncapped (bf16: 96), which halves the programs an SM holds; it runs capped at 128
    by default, so its tile variants are capped too."""
    out = [{}]
    if name.startswith("decode"):
        for bn, st, w in ((32, 2, 4), (64, 3, 4), (64, 4, 4), (128, 2, 4), (128, 3, 4), (64, 2, 8), (128, 2, 8),
                          (128, 3, 8)):
            out.append({"config": {"BLOCK_N": bn, "num_stages": st, "num_warps": w}})
        out += [{"config": {"maxnreg": r}} for r in (112, 128, 168, None)]  # None: no cap (fp8 decode has 128)
        if fp8:
            out.append({"config": {"FP16_DOT": False}})
        out += [{"num_splits": s} for s in (1, 2, 4, 8, 16)]
    else:
        for bm, bn, w, st in ((64, 128, 4, 2), (64, 64, 8, 2), (64, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 2),
                              (128, 32, 8, 2), (128, 64, 4, 2), (128, 64, 8, 3)):
            out.append({"config": {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}})
    return out


def _batch(reqs: list[tuple[int, int]], g: torch.Generator, heads: tuple[int, int, int], kv_dtype: torch.dtype,
           device: str):
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
    heads, kv_heads, d = heads
    kv = torch.randn(2, num_blocks, BLOCK, kv_heads, d, generator=g).to(kv_dtype)
    q = torch.randn(int(qsl[-1]), heads, d, generator=g).to(torch.bfloat16)
    lens = torch.tensor([s for _, s in reqs], dtype=torch.int32)
    return [t.to(device) for t in (q, kv, qsl, lens, bt)]


def sweep(name: str, seed: int = 0, kv_dtype: str = "bf16", device: str = "cuda", iters: int = 30,
          max_reqs: int | None = None, max_variants: int | None = None) -> dict:
    """Every variant of ``name``: time, KV read bandwidth, TFLOP/s, agreement with the default.
    With an fp8 cache the bf16 default runs too (``bf16_default``), for the ratio.
    ``max_reqs`` / ``max_variants`` shrink the run (the interpreter's smoke test)."""
    reqs = _shape(name, random.Random(seed))[:max_reqs]
    (heads, kv_heads, d), window, decode_bound = geometry(name)
    fp8 = kv_dtype == "fp8"
    q, kv, qsl, lens, bt = _batch(reqs, torch.Generator().manual_seed(seed), (heads, kv_heads, d),
                                  KV_DTYPES[kv_dtype], device)
    decode = name.startswith("decode")
    graph = decode and device.startswith("cuda")
    bounds = dict(max_query_len=max(x for x, _ in reqs),
                  max_seq_len=decode_bound if decode else max(s for _, s in reqs), sliding_window=window)
    read = [min(s, window) if window else s for _, s in reqs]
    kv_bytes = sum(read) * kv_heads * d * 2 * kv.element_size()
    flops = sum(4 * x * (r - x + (x + 1) / 2) * d * heads for (x, _), r in zip(reqs, read))  # causal
    ref = None

    def measure(v: dict, cache: torch.Tensor, args: dict) -> dict:
        nonlocal ref
        fn = lambda: paged_attention_triton(q, cache, qsl, lens, bt, d ** -0.5, **bounds, **args)  # noqa: E731
        try:
            out = fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as e:  # a tile that does not compile or fit is recorded, not fatal
            print(f"  {name} {v}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            return {"variant": v, "error": f"{type(e).__name__}: {str(e)[:120]}"}
        if ref is None:
            ref = out.float()
        ok = bool(torch.allclose(out.float(), ref, atol=3e-2, rtol=3e-2))
        us = 1e3 * time_ms(fn, iters=iters, graph=graph, cuda=device.startswith("cuda"))
        return {"variant": v, "us": us, "ok": ok, "kv_gb_s": kv_bytes / us / 1e3, "tflop_s": flops / us / 1e6}

    rows = [measure(v, kv, v) for v in _variants(name, fp8)[:max_variants]]
    base = measure({"bf16": True}, kv.to(torch.bfloat16), {}) if fp8 else None
    good = [r for r in rows if r.get("ok")]
    best = min(good, key=lambda r: r["us"])
    res = {"shape": name, "kv_dtype": kv_dtype, "num_reqs": len(reqs), "num_tokens": int(q.shape[0]),
           "kv_mb": kv_bytes / 1e6, "gflop": flops / 1e9, "default": rows[0], "best": best, "rows": rows}
    dflt, b = rows[0], best
    line = (f"{name:16s} {kv_dtype} default {dflt['us']:8.1f} us ({dflt['kv_gb_s']:6.0f} GB/s, "
            f"{dflt['tflop_s']:5.0f} TF/s)  best {b['us']:8.1f} us ({b['kv_gb_s']:6.0f} GB/s, "
            f"{b['tflop_s']:5.0f} TF/s) {b['variant']}")
    if base is not None and "us" in base:
        res["bf16_default"] = base
        line += f"; bf16 default {base['us']:.1f} us: default {base['us'] / dflt['us']:.2f}x, " \
                f"best {base['us'] / b['us']:.2f}x"
    print(line, flush=True)
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="bf16")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    write_json(args.json, {name: sweep(name, kv_dtype=args.kv_dtype) for name in args.shapes})


if __name__ == "__main__":
    main()
