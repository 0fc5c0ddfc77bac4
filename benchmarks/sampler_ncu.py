"""Nsight Compute's view of one split-sampler call (session 10): run under ncu with
``--profile-from-start off``; only the calls inside the profiled region are captured.

Region: one cut call at the Sampler's shape (read 1 with the fused decide, read 2, two
rounds), one with the decide as a launch of its own (4 warps), and the probe's lane-lists
pass alone (``sampler_probe.py`` lists3nt, s8 b512 w2), each compiled and run once before.

Usage (GPU): ncu --clock-control none --profile-from-start off [sections] python3 benchmarks/sampler_ncu.py
[--fused-only]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.sampler_probe import probe  # noqa: E402
from core_runner.bench.sampler_bench import bench_top_p_case  # noqa: E402
from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton  # noqa: E402
from core_runner.sample.sampler import cut_shape  # noqa: E402


def main() -> None:
    fused_only = "--fused-only" in sys.argv[1:]  # the cut call with the fused decide alone (no compile of the others)
    logits, m, out, paths = bench_top_p_case(torch.device("cuda"))
    calls = [lambda extra=extra: sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p,
                                                         m.log_min_p, out=out, paths=paths,
                                                         **dict(cut_shape(m), **extra))
             for extra in ({"narrow_draw": False}, {"narrow_draw": False, "decide_warps": 4})]
    if fused_only:
        calls = calls[:1]
    else:
        calls.append(lambda: probe(logits, "lists3nt", 8, 512, 2))
    for c in calls:
        c()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for c in calls:
        c()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
