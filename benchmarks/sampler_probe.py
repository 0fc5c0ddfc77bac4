"""Where the time of the sampler's first read goes: one pass over [n, V] fp32 logits in
variants that add one piece of ``gumbel_pass`` at a time, each with one program per row
or SPLIT programs per row (a contiguous part each), at a few tile widths and warp counts.

  read   load, scale, running max (the floor: what a bare read costs in this layout)
  hash   + the per-token hash (kept alive by folding it into the result)
  bound  + the hash-bound skip test and the per-tile "any" reduction (no logs)
  full   ``gumbel_pass`` itself (temperature only: no statistics)
  fullz  ``gumbel_pass`` with the lane maxima, Z and tile maxima (top-p's read 1)
  stats  ``gumbel_pass`` with the statistics of fullz and no draw (nucleus first's read 1)
  lists3 / lists3nt / lists2  ``lane_lists_pass`` (read 1 of the lane lists, the Sampler's
         default since session 6): depth 3 with tile maxima / without / depth 2; the
         list store and the part statistics of the sampler's read 1 are left out (session
         7 measured its former scaled loop against this one: RESULTS.md)

Times are GPU times (CUDA events around back-to-back launches), next to torch's copy
(half of it is "one read"), amax and sum over the rows on the same tensor.

Usage (GPU): python3 benchmarks/sampler_probe.py [--json out.json]. Also runs on CPU
tensors under TRITON_INTERPRET=1 with small shapes (the smoke test does that).
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from core_runner.bench.sampler_bench import _time
from core_runner.kernels.gumbel_sample import (
    _could_reach, col_hash, gumbel_pass, row_keys, token_hash, use_fast_log,
)
from core_runner.kernels.lane_lists_triton import lane_lists_pass

MODES = {"read": 0, "hash": 1, "bound": 2, "full": 3, "fullz": 4, "stats": 7, "lists3": 8, "lists3nt": 9,
         "lists2": 10}


@triton.jit
def _probe_kernel(logits_ptr, s_row, seed_ptr, pos_ptr, out_ptr, vocab, part, inv_t,
                  MODE: tl.constexpr, SPLIT: tl.constexpr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr,
                  NT: tl.constexpr):
    i = tl.program_id(0)
    s = tl.program_id(1)
    row = logits_ptr + i.to(tl.int64) * s_row
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    lo = s * part
    hi = tl.minimum(lo + part, vocab)
    if MODE == 3:
        tok, _a1, _a2, _nf, _z, _tm = gumbel_pass(row, hi, inv_t, 0.0, k1, k2, False, False, False, False,
                                                  FAST_LOG, BLOCK, NT, 1, lo)
        res = tok.to(tl.float32)
    elif (MODE == 4) | (MODE == 7):
        tok, a1, _a2, nf, z, tm = gumbel_pass(row, hi, inv_t, 0.0, k1, k2, False, True, False, True,
                                              FAST_LOG, BLOCK, NT, 1, lo, DRAW=MODE != 7)
        res = tok.to(tl.float32) + z + nf.to(tl.float32) + tl.max(a1, axis=0) + tl.max(tm, axis=0)
    elif MODE >= 8:
        a1, i1, a2, i2, bound, b, nf, m, zl, tm = lane_lists_pass(row, lo, hi, inv_t, BLOCK, NT,
                                                                  3 if MODE < 10 else 2, MODE != 9)
        res = (tl.max(a1, axis=0) + tl.max(tl.where(bound > -float("inf"), bound + a2, 0.0), axis=0)
               + (tl.max(i1 + i2, axis=0) & 1) + tl.where(b > -float("inf"), b, 0.0)
               + nf + m + tl.sum(zl, axis=0) + tl.max(tl.where(tm < float("inf"), tm, 0.0), axis=0))
    else:
        lanes = tl.arange(0, BLOCK)
        best = tl.full([BLOCK], -float("inf"), tl.float32)
        acc = tl.zeros([BLOCK], dtype=tl.uint32)
        best_row = tl.full([], -float("inf"), tl.float32)
        n_any = tl.zeros([], tl.int32)
        hc = col_hash(lo + lanes)
        nxt = tl.load(row + lo + lanes, mask=lo + lanes < hi, other=-float("inf"))
        for start in tl.range(lo, hi, BLOCK):
            cols = start + lanes
            x = nxt.to(tl.float32) * inv_t
            nxt = tl.load(row + BLOCK + cols, mask=cols + BLOCK < hi, other=-float("inf"))
            best = tl.maximum(best, x)
            if MODE >= 1:
                h = token_hash(hc, k1, k2)
                acc ^= h
                if MODE >= 2:
                    n_any += tl.max(_could_reach(x, h, best_row).to(tl.int32), axis=0)
                    best_row = tl.maximum(best_row, tl.max(x, axis=0) + 3.0)
            hc += (BLOCK * 0x9E3779B1) & 0xFFFFFFFF
        res = tl.max(best, axis=0) + (tl.max(acc, axis=0) & 1).to(tl.float32) + n_any.to(tl.float32) * 1e-9
    tl.store(out_ptr + i * SPLIT + s, res)


def probe(logits: torch.Tensor, mode: str, split: int = 1, block: int = 2048, num_warps: int = 4) -> torch.Tensor:
    n, vocab = logits.shape
    dev = logits.device
    seeds = torch.arange(n, device=dev)
    pos = torch.full((n,), 100, device=dev)
    out = torch.empty(n * split, device=dev)
    part = triton.cdiv(triton.cdiv(vocab, split), block) * block
    _probe_kernel[(n, split)](
        logits, logits.stride(0), seeds, pos, out, vocab, part, 1.0 / 0.7, MODE=MODES[mode],
        SPLIT=split, FAST_LOG=use_fast_log(dev), BLOCK=block, NT=triton.next_power_of_2(triton.cdiv(part, block)),
        num_warps=num_warps,
    )
    return out


def _time_ms(fn) -> float:
    """GPU milliseconds per call (the sampler bench's event timing: back-to-back calls)."""
    return 1e3 * _time(fn, torch.device("cuda"), iters=10, warmup=1)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    logits = torch.randn(1024, 151936, device="cuda") * 4.0
    dst = torch.empty_like(logits)
    read_ms = _time_ms(lambda: dst.copy_(logits)) / 2
    res = {"read_ms_at_copy_bw": read_ms}
    print(f"one read at copy bandwidth: {read_ms:.3f} ms", flush=True)
    for name, fn in (("torch_amax", lambda: logits.amax(dim=1)), ("torch_sum", lambda: logits.sum(dim=1))):
        res[name] = _time_ms(fn)
        print(f"  {name}: {res[name]:.3f} ms ({res[name] / read_ms:.2f} reads)", flush=True)
    # (split, block, warps); BLOCK / (32 warps) values per thread and array: 8-16 keeps registers
    shapes = [(1, 2048, 8), (8, 512, 1), (16, 512, 1), (16, 256, 1), (4, 1024, 2), (8, 1024, 4), (4, 2048, 4)]
    list_shapes = [(8, 512, 2), (8, 512, 1), (16, 256, 1), (16, 512, 2), (8, 1024, 4)]
    # (the other modes: smoke test, RESULTS.md)
    for mode in ("read", "stats", "lists3", "lists3nt", "lists2"):
        for split, block, warps in (shapes if mode in ("read", "stats") else list_shapes):
            ms = _time_ms(lambda: probe(logits, mode, split, block, warps))
            key = f"{mode}_s{split}_b{block}_w{warps}"
            res[key] = ms
            print(f"  {key}: {ms:.3f} ms ({ms / read_ms:.2f} reads)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
