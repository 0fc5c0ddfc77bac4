"""Where the sampler's host time goes, next to its pure GPU time (session 7).

Prints, for the bench's top-p case ([1024 x 151,936] fp32, temperature 0.7, top-p 0.9):
  - host microseconds to issue one Sampler call, one ``sample_with_cuts_triton`` call,
    one launch of a tiny Triton kernel with 30 arguments, one ``torch.empty``;
  - GPU milliseconds of the cut kernels replayed from a CUDA graph (no host gaps) next
    to the same calls issued back to back (the bench's timing);
  - the top functions of a cProfile of 50 Sampler calls (by own time).

Usage (GPU): python3 benchmarks/sampler_host.py [--json out.json]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import triton
import triton.language as tl

from core_runner.bench.sampler_bench import _time, bench_logits, bench_meta, graph_ms
from core_runner.kernels import fast_launch
from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
from core_runner.sample.sampler import Sampler, cut_shape


@triton.jit
def _many_args(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, n0, n1,
               n2, n3, n4, n5, n6, n7, n8, n9, B: tl.constexpr, C: tl.constexpr):
    i = tl.program_id(0)
    if i < 0:
        tl.store(a0, n0 + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9 + B + C)


def _host_us(fn, iters: int = 200, busy: bool = False) -> float:
    """Host microseconds to issue one call (busy: behind ~50 ms of GPU sleep, so a call
    that waits on the GPU shows it)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(int(1e8))
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t) / iters
    torch.cuda.synchronize()
    return 1e6 * dt


def _launcher_parts(bufs: list) -> dict:
    """Host microseconds of the pieces of one cached launch (session 11): the compiled
    30-argument kernel run straight with its 20 pointers as tensors (the C launcher then
    calls data_ptr() and cuPointerGetAttribute on each) or as ints, and the Python calls
    around it."""
    kernel = _many_args[(1,)](*bufs, *range(10), B=4, C=8)
    torch.cuda.synchronize()
    ints = [b.data_ptr() for b in bufs]
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())

    def run(ptrs):
        return lambda: kernel.run(1, 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None,
                                  *ptrs, *range(10), 4, 8)
    return {
        "host_us_run_30_args_tensors": _host_us(run(bufs)),
        "host_us_run_30_args_ints": _host_us(run(ints)),
        "host_us_data_ptr": _host_us(lambda: bufs[0].data_ptr()),
        "host_us_current_device": _host_us(torch.cuda.current_device),
        "host_us_raw_stream": _host_us(lambda: torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())),
        "host_us_float_contiguous": _host_us(lambda: bufs[0].float().contiguous()),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    n, vocab = 1024, 151936
    logits = bench_logits(n, vocab, dev)
    m = bench_meta(n, dev, 0.7, 0.9)
    sampler = Sampler(use_triton=True)
    shape = cut_shape(m)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    paths = torch.empty(n, dtype=torch.int32, device=dev)

    def cut():
        return sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p, m.log_min_p,
                                       out=out, paths=paths, **shape)

    fast_launch.ENABLED = False  # (the first figures without it, as session 8's)
    bufs = [torch.empty(16, device=dev) for _ in range(20)]
    res = {
        "host_us_sampler_call": _host_us(lambda: sampler(logits, m)),
        "host_us_cut_call": _host_us(cut),
        "host_us_triton_launch_30_args": _host_us(lambda: _many_args[(1,)](*bufs, *range(10), B=4, C=8)),
        "host_us_torch_empty": _host_us(lambda: torch.empty((n, 512), device=dev)),
        "host_us_torch_full": _host_us(lambda: torch.full((n, 512), -1.0, device=dev)),
        "gpu_ms_cut_back_to_back": 1e3 * _time(cut, dev, 20, 3),
        "gpu_ms_sampler_back_to_back": 1e3 * _time(lambda: sampler(logits, m), dev, 20, 3),
    }
    res.update(_launcher_parts(bufs))
    res["gpu_ms_cut_graph_replay"] = graph_ms(cut, dev)
    cut()
    res["paths_scale4"] = {int(k): int(v) for k, v in zip(*torch.unique(paths, return_counts=True))}
    # does the host wait on the GPU? the same calls issued behind ~50 ms of GPU sleep
    res["host_us_cut_call_gpu_busy"] = _host_us(cut, 20, busy=True)
    fast_launch.ENABLED = True
    res["host_us_cut_call_fast"] = _host_us(cut)
    res["host_us_sampler_call_fast"] = _host_us(lambda: sampler(logits, m))
    res["host_us_cut_call_fast_gpu_busy"] = _host_us(cut, 20, busy=True)
    res["gpu_ms_sampler_back_to_back_fast"] = 1e3 * _time(lambda: sampler(logits, m), dev, 20, 3)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        cut()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    print("cut() with fast launch:", buf.getvalue()[:3000], flush=True)
    for k, v in res.items():
        print(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        sampler(logits, m)
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(buf.getvalue()[:6000], flush=True)
    fast_launch.ENABLED = True
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
