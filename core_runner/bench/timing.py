"""Milliseconds per call of a GPU operation, as the benchmarks' sweeps time it."""
from __future__ import annotations

import time
from typing import Callable

import torch


def time_ms(fn: Callable[[], object], *, iters: int, warmup: int = 3, graph: bool = False,
            cuda: bool | None = None) -> float:
    """``iters`` calls after ``warmup`` (the first compiles): on CUDA between events, back to
    back or (``graph``) captured in one CUDA graph and replayed, as the engine runs decode
    steps (eager, a short call also times the host's launches: ~40 us a Triton launch);
    elsewhere (``cuda`` False; None: whether CUDA is available) wall time."""
    for _ in range(warmup):
        fn()
    if not (torch.cuda.is_available() if cuda is None else cuda):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return 1e3 * (time.perf_counter() - t) / iters
    torch.cuda.synchronize()
    run, calls = fn, iters
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                fn()
        g.replay()
        run, calls = g.replay, 1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters
