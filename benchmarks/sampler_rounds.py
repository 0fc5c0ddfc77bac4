"""Read 2 and the histogram rounds of the split sampler at other settings (sessions 8-9).

For the bench's top-p case ([1024 x 151,936] fp32, temperature 0.7, top-p 0.9) on its
peaked logits (N(0, 4^2)) and on flat ones (N(0, s^2), s = 1, 2, 3), per variant of
(rounds, read 2's chunk columns, register cap of read 2 and the rounds, the decide fused
into read 1 or a launch of its own with some warps, the lists' draw narrow or on all
their slots, launches through ``fast_launch`` or not): the GPU time from a CUDA-graph
replay (no host gaps), the host time to issue one call, the rows per path, the rows off
the torch reference and each launch's time (events, one call). Session 8 left rounds 2,
chunks of 2,048 and no cap (255 registers on sm90: 2 programs per SM); flat rows took
6-24 ms.

Usage (GPU): python3 benchmarks/sampler_rounds.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from core_runner.bench.sampler_bench import bench_logits, bench_meta, graph_ms
from core_runner.kernels import fast_launch, split_workspace
from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
from core_runner.sample.sampler import cut_shape, gumbel_sample_ref

# (session 9: chunks of 8,192 columns did not compile within 5 minutes on the H200 image; rounds 0 is 259 ms at s = 2)
# decide: 0 fused into read 1, else a launch of its own with that many warps
VARIANTS = [dict(rounds=2, chunk=2048, maxnreg=128, decide=0, fast=True),  # the Sampler's (session 9)
            dict(rounds=2, chunk=2048, maxnreg=128, decide=0, fast=True, narrow=False),
            dict(rounds=2, chunk=2048, maxnreg=128, decide=4, fast=True)]
FLAT = (0,)  # the variants that also run on flat rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    n, vocab = 1024, 151936
    base = bench_logits(n, vocab, dev, scale=1.0)  # the bench's, before its scale
    m = bench_meta(n, dev, 0.7, 0.9)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    paths = torch.empty(n, dtype=torch.int32, device=dev)
    res = {}
    for scale in (4.0, 3.0, 2.0, 1.0):
        logits = base * scale
        want = gumbel_sample_ref(logits, m.inv_temp, m.seeds, m.positions,
                                 top_k_top_p_threshold_ref(logits, m.inv_temp, m.top_k, m.top_p, m.log_min_p))
        for vi, v in enumerate(VARIANTS):
            split_workspace.CHUNK_COLS = v["chunk"]
            fast_launch.ENABLED = v.get("fast", False)
            shape = dict(cut_shape(m), rounds=v["rounds"], round_maxnreg=v["maxnreg"], decide_warps=v["decide"],
                         narrow_draw=v.get("narrow", True))

            def cut(logits=logits, shape=shape):
                return sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p,
                                               m.log_min_p, out=out, paths=paths, **shape)

            key = f"s{scale:g}_r{v['rounds']}_c{v['chunk']}_reg{v['maxnreg'] or 'max'}"
            key += f"_dw{v['decide']}" + ("_fast" if v.get("fast") else "")
            key += "" if v.get("narrow", True) else "_wide"
            if scale < 4.0 and vi not in FLAT:
                continue
            cut()
            off = int((out != want).sum())
            kinds = {int(k): int(c) for k, c in zip(*torch.unique(paths, return_counts=True))}
            t0 = time.perf_counter()
            for _ in range(20):
                cut()
            host_us = 1e6 * (time.perf_counter() - t0) / 20
            torch.cuda.synchronize()
            marks: list = []
            sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p, m.log_min_p,
                                    out=out, paths=paths, marks=marks, **shape)
            torch.cuda.synchronize()
            launches = {name: round(a.elapsed_time(b), 4) for (_, a), (name, b) in zip(marks, marks[1:])}
            res[key] = dict(gpu_ms_graph=graph_ms(cut, dev, 10, 2), host_us=host_us, paths=kinds, rows_off=off,
                            launches_ms=launches)
            print(f"  {key}: graph {res[key]['gpu_ms_graph']:.3f} ms, host {host_us:.0f} us, paths {kinds}, "
                  f"rows off {off}, launches {launches}", flush=True)
        del logits, want
    split_workspace.CHUNK_COLS = 2048
    fast_launch.ENABLED = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sampler_rounds": res}, f, indent=1)
    return res


if __name__ == "__main__":
    main()
