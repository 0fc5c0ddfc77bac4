"""``core-runner bench --sampler``: the sampler alone on a large batch of logits.

At batch 1024 x vocab 151,936 fp32 (the target shape) it times temperature + top-p
sampling through the real pipeline (``Sampler`` with Triton kernels on a GPU), and sets
it against two yardsticks: one read of the logits at the device's copy bandwidth (a
copy reads and writes each byte once, so a read takes half a copy), and
``torch.softmax`` + ``torch.multinomial`` on the same logits. It also reports the peak
memory each allocates beyond the logits (CUDA only), the times of other cuts (top-k 50 +
top-p 0.9, top-p 0.5, min-p 0.1) and, on CUDA, how the fused cut kernel settled the
top-p rows (draw kept / redrawn from its candidates / pivot search). On the CPU the same
code runs with small shapes as a smoke test (the torch reference path; the numbers mean
little there).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

from core_runner.sample.metadata import SamplingMetadata
from core_runner.sample.sampler import Sampler, cut_shape

# the path codes of ``sample_with_cuts_triton``
PATH_NAMES = {0: "no cut", 1: "kept", 2: "redrawn", 3: "searched", 4: "histogram rounds", 7: "nucleus first",
              8: "lane lists"}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device, iters: int, warmup: int, log: list | None = None) -> float:
    """Median seconds per call. On CUDA: device time, CUDA events around ``iters``
    back-to-back calls (so the host's launch work overlaps the previous call, as in the
    engine's asynchronous loop), median of five such rounds. ``log`` receives each round's
    (device ms, host ms to issue its calls) per call: host >= device means the GPU waited."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if device.type == "cuda":
        rounds = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            t = time.perf_counter() - t
            b.record()
            b.synchronize()
            rounds.append(a.elapsed_time(b) / 1e3 / iters)
            if log is not None:
                log.append((round(1e3 * rounds[-1], 4), round(1e3 * t / iters, 4)))
        return statistics.median(rounds)
    return _wall(fn, device, iters)


def graph_ms(fn: Callable[[], object], device: torch.device, iters: int = 20, warmup: int = 3) -> float:
    """GPU milliseconds of fn replayed from a CUDA graph captured on a side stream (no host
    gaps between its launches, unlike back-to-back calls)."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return 1e3 * _time(g.replay, device, iters, warmup)


def _wall(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median wall seconds of one call with a device sync after each (launch and sync included)."""
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _host(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median host seconds to issue one call (no sync inside the loop): when this exceeds
    the device time per call, the GPU waits for the host and the event timing shows it."""
    _sync(device)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - t) / iters)
        _sync(device)
    return statistics.median(times)


def _peak_extra_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Bytes allocated at peak during one call beyond what was live before it (CUDA)."""
    if device.type != "cuda":
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    _sync(device)
    del out
    return torch.cuda.max_memory_allocated(device) - base


def bench_logits(batch: int, vocab: int, dev: torch.device, seed: int = 0, scale: float = 4.0) -> torch.Tensor:
    """The bench's logits: [batch, vocab] float32 N(0, scale^2), from a generator seeded with seed."""
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randn(batch, vocab, generator=g, device=dev) * scale


def bench_meta(batch: int, dev: torch.device, temperature: float = 0.7, p: float = 1.0, k: int = -1,
               min_p: float = 0.0) -> SamplingMetadata:
    """The bench's sampling metadata: every row sampled at one temperature (seed = row,
    position 100) with the same cuts (none when p = 1, k <= 0 and min_p = 0)."""
    m = SamplingMetadata(
        inv_temp=torch.full((batch,), 1.0 / temperature, device=dev),
        seeds=torch.arange(batch, dtype=torch.int64, device=dev),
        positions=torch.full((batch,), 100, dtype=torch.int64, device=dev), any_random=True,
    )
    if p < 1.0 or k > 0 or min_p > 0.0:
        m.top_k = torch.full((batch,), k, dtype=torch.int32, device=dev)
        m.top_p = torch.full((batch,), p, device=dev)
        m.log_min_p = torch.full((batch,), min_p, device=dev).log()
        m.top_p_only = k <= 0 and min_p == 0.0
        m.all_top_p = m.top_p_only and p < 1.0
    return m


def bench_top_p_case(dev: torch.device, batch: int = 1024, vocab: int = 151936):
    """The bench's top-p case for the sampler scripts: (its logits, metadata at temperature
    0.7 and top-p 0.9, an int64 token and an int32 path buffer of ``batch`` rows)."""
    return (bench_logits(batch, vocab, dev), bench_meta(batch, dev, 0.7, 0.9),
            torch.empty(batch, dtype=torch.int64, device=dev), torch.empty(batch, dtype=torch.int32, device=dev))


def run_sampler_bench(
    device: str = "cuda", batch: int = 1024, vocab: int = 151936, temperature: float = 0.7, top_p: float = 0.9,
    iters: int = 20, warmup: int = 3, seed: int = 0, sweep: bool = False, one_program_cuts: bool = True,
    scales: tuple[float, ...] = (),
) -> dict:
    dev = torch.device(device)
    logits = bench_logits(batch, vocab, dev, seed)
    sampler = Sampler(use_triton=dev.type == "cuda")

    def meta(p: float, k: int = -1, min_p: float = 0.0) -> SamplingMetadata:
        return bench_meta(batch, dev, temperature, p, k, min_p)

    top_p_meta, temp_meta = meta(top_p), meta(1.0)
    other = {"top_k50_top_p0.9": meta(0.9, k=50), "top_p0.5": meta(0.5), "min_p0.1": meta(1.0, min_p=0.1)}
    if not one_program_cuts:  # (top-k and min-p batches take the one-program kernel: a long compile)
        other = {"top_p0.5": other["top_p0.5"]}
    dst = torch.empty_like(logits)
    fns = {
        "top_p": lambda: sampler(logits, top_p_meta).sampled,
        "temperature_only": lambda: sampler(logits, temp_meta).sampled,
        **{name: (lambda m=m: sampler(logits, m).sampled) for name, m in other.items()},
        "torch_softmax_multinomial": lambda: torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1),
        "copy": lambda: dst.copy_(logits),
    }
    secs, rounds = {}, {}
    for k, f in fns.items():
        secs[k] = _time(f, dev, iters, warmup, rounds.setdefault(k, []))
        print(f"  {k}: {1e3 * secs[k]:.3f} ms", flush=True)
    # the same two with a sync after every call (the figures of sessions 1-3 were taken so)
    wall = {k: 1e3 * _wall(fns[k], dev, iters) for k in ("top_p", "copy")} if dev.type == "cuda" else None
    read_s = secs["copy"] / 2
    nbytes = logits.numel() * logits.element_size()
    res = {
        "device": str(dev), "batch": batch, "vocab": vocab, "temperature": temperature, "top_p": top_p,
        "logits_mib": nbytes / 2**20,
        "copy_bw_gb_s": 2 * nbytes / secs["copy"] / 1e9,
        "logits_read_ms": 1e3 * read_s,
        "sampler_top_p_ms": 1e3 * secs["top_p"],
        "sampler_temperature_only_ms": 1e3 * secs["temperature_only"],
        "torch_softmax_multinomial_ms": 1e3 * secs["torch_softmax_multinomial"],
        "ratio_to_read": secs["top_p"] / read_s,
        "speedup_vs_torch": secs["torch_softmax_multinomial"] / secs["top_p"],
        **{f"sampler_{name}_ms": 1e3 * secs[name] for name in other},
        "top_p_rows_by_path": _top_p_paths(logits, top_p_meta) if sampler.use_triton else None,
        "top_p_rows_off_reference": _off_reference(sampler, logits, top_p_meta) if sampler.use_triton else None,
        "top_p_launches_ms": _launches(logits, top_p_meta, iters) if sampler.use_triton else None,
        "timing": "cuda events, back-to-back calls" if dev.type == "cuda" else "wall, sync per call",
        "wall_sync_each_ms": wall,
        "top_p_host_issue_ms": 1e3 * _host(fns["top_p"], dev, iters),
        "rounds_device_host_ms": rounds if dev.type == "cuda" else None,
        "top_p_graph_ms": graph_ms(fns["top_p"], dev) if dev.type == "cuda" else None,
    }
    if sampler.use_triton and sweep:
        res["tile_sweep_ms"] = _tile_sweep(logits, top_p_meta, dev, iters, warmup)
    if scales:
        res["top_p_by_scale"] = _by_scale(sampler, logits, top_p_meta, scales, dev, iters, warmup)
    for key in ("top_p", "torch_softmax_multinomial"):
        extra = _peak_extra_bytes(fns[key], dev)
        res[f"{key}_peak_extra_mib"] = None if extra is None else extra / 2**20
    return res


def _by_scale(sampler, logits, m, scales, dev, iters, warmup) -> dict:
    """Top-p on the bench's logits rescaled (N(0, s^2) in place of N(0, 4^2)): flatter rows
    have larger nuclei (s = 2: ~9,000 tokens), which the lane lists do not hold. Per scale:
    GPU ms, rows per path and rows off the reference."""
    out = {}
    for s in scales:
        x = logits * (s / 4.0)
        ms = 1e3 * _time(lambda x=x: sampler(x, m).sampled, dev, iters, warmup)
        paths = _top_p_paths(x, m) if sampler.use_triton else None
        out[str(s)] = {"ms": ms, "paths": paths, "rows_off_reference": _off_reference(sampler, x, m)}
        print(f"  top_p at logit scale {s}: {ms:.3f} ms; paths {paths}; rows off the reference "
              f"{out[str(s)]['rows_off_reference']}", flush=True)
        del x
    return out


def _off_reference(sampler: Sampler, logits: torch.Tensor, m: SamplingMetadata) -> int:
    """Rows whose top-p token differs from the torch reference's (sorted threshold, then
    the same Gumbel noise) on the bench's own logits: 0 expected."""
    from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
    from core_runner.sample.sampler import gumbel_sample_ref

    thr = top_k_top_p_threshold_ref(logits, m.inv_temp, m.top_k, m.top_p, m.log_min_p)
    want = gumbel_sample_ref(logits, m.inv_temp, m.seeds, m.positions, thr)
    return int((sampler(logits, m).sampled != want).sum())


def _launches(logits: torch.Tensor, m: SamplingMetadata, iters: int, **shape) -> dict[str, float] | None:
    """Median GPU ms of each launch of the split cut kernel on the top-p case (CUT_SHAPE,
    or ``shape``), from CUDA events between the launches of back-to-back calls; None when
    the shape is not split."""
    from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton

    shape = shape or cut_shape(m)
    if shape.get("split", 1) <= 1:
        return None
    calls = []
    for _ in range(iters):
        marks: list = []
        sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p, m.log_min_p, marks=marks,
                                **shape)
        calls.append(marks)
    _sync(logits.device)
    out = {}
    for j in range(1, len(calls[0])):
        out[calls[0][j][0]] = statistics.median(c[j - 1][1].elapsed_time(c[j][1]) for c in calls)
    return out


def _top_p_paths(logits: torch.Tensor, m: SamplingMetadata, **shape) -> dict[str, int]:
    """How the fused cut kernel settled the rows of the top-p case (CUT_SHAPE, or
    ``shape``): rows per path (``sample_with_cuts_triton``'s codes, named)."""
    from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton

    paths = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)
    sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p, m.log_min_p, paths=paths,
                            **(shape or cut_shape(m)))
    counts = torch.bincount(paths.long(), minlength=len(PATH_NAMES)).tolist()
    return {PATH_NAMES.get(code, str(code)): c for code, c in enumerate(counts) if c}


SWEEP_SHAPES = (
    dict(split=8, block=1024, num_warps=4, nucleus_first=True, cap=4096, lists=3, list_slots=512, tile_max=False,
         all_top_p=True),
    dict(split=8, block=512, num_warps=2, nucleus_first=True, cap=4096, lists=3, list_slots=256, tile_max=True,
         all_top_p=True),
    dict(split=8, block=512, num_warps=2, nucleus_first=True, cap=4096, lists=3, list_slots=256, tile_max=False,
         all_top_p=True),
)


def _tile_sweep(logits, top_p_meta, dev, iters, warmup) -> dict:
    """The cut sampler on the top-p case at other launch shapes (each row over ``split``
    programs of ``num_warps`` warps, tiles of ``block``; nucleus first, lane lists), each
    with its per-launch breakdown, rows per path and rows off the torch reference: which
    shape the defaults should take."""
    from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
    from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
    from core_runner.sample.sampler import gumbel_sample_ref

    m = top_p_meta
    want = gumbel_sample_ref(logits, m.inv_temp, m.seeds, m.positions,
                             top_k_top_p_threshold_ref(logits, m.inv_temp, m.top_k, m.top_p, m.log_min_p))
    out = {}
    for shape in SWEEP_SHAPES:
        cut = lambda: sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p,  # noqa: E731
                                              m.log_min_p, **shape)
        key = "top_p_s{split}_b{block}_w{num_warps}_cap{cap}".format(**shape)
        key += "_nf" if shape.get("nucleus_first") else ""
        key += "_L{lists}x{list_slots}".format(**shape) if shape.get("lists") else ""
        key += "_nt" if shape.get("tile_max") is False else ""
        out[key] = 1e3 * _time(cut, dev, iters, warmup)
        launches = _launches(logits, m, iters, **shape)
        off = int((cut() != want).sum())
        print(f"  {key}: {out[key]:.3f} ms; launches " + ", ".join(f"{k} {v:.3f}" for k, v in launches.items())
              + f"; paths {_top_p_paths(logits, m, **shape)}; rows off the reference {off}", flush=True)
    return out


def format_sampler_result(r: dict) -> str:
    lines = [
        f"sampler [{r['batch']} x {r['vocab']}] fp32 on {r['device']}: temperature {r['temperature']} + "
        f"top-p {r['top_p']} {r['sampler_top_p_ms']:.3f} ms (temperature only {r['sampler_temperature_only_ms']:.3f} ms)",
        f"  one read of the logits at copy bandwidth ({r['copy_bw_gb_s']:.0f} GB/s): {r['logits_read_ms']:.3f} ms "
        f"-> ratio {r['ratio_to_read']:.2f}",
        f"  torch softmax + multinomial: {r['torch_softmax_multinomial_ms']:.3f} ms -> "
        f"{r['speedup_vs_torch']:.2f}x faster",
    ]
    if "sampler_top_p0.5_ms" in r:
        names = {"top_k50_top_p0.9": "top-k 50 + top-p 0.9", "top_p0.5": "top-p 0.5", "min_p0.1": "min-p 0.1"}
        line = "  other cuts: " + ", ".join(f"{label} {r[f'sampler_{key}_ms']:.3f} ms" for key, label in names.items()
                                            if f"sampler_{key}_ms" in r)
        if r.get("top_p_rows_off_reference") is not None:
            line += f"; top-p rows off the torch reference: {r['top_p_rows_off_reference']}"
        if r.get("top_p_rows_by_path"):
            line += "; top-p rows by path: " + ", ".join(f"{k} {v}" for k, v in r["top_p_rows_by_path"].items())
        lines.append(line)
    if r.get("top_p_host_issue_ms") is not None:
        lines.append(f"  host time to issue one top-p call: {r['top_p_host_issue_ms']:.3f} ms")
    if r.get("top_p_graph_ms") is not None:
        lines.append(f"  top-p from a CUDA graph: {r['top_p_graph_ms']:.3f} ms; rounds (device, host ms a call): "
                     f"{r['rounds_device_host_ms']['top_p']}")
    if r.get("top_p_launches_ms"):
        lines.append("  top-p launches (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in r["top_p_launches_ms"].items()))
    if r.get("tile_sweep_ms"):
        lines.append("  launch shapes (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in r["tile_sweep_ms"].items()))
    if r.get("top_p_peak_extra_mib") is not None:
        lines.append(f"  peak extra memory: sampler {r['top_p_peak_extra_mib']:.1f} MiB, torch "
                     f"{r['torch_softmax_multinomial_peak_extra_mib']:.1f} MiB (logits {r['logits_mib']:.0f} MiB)")
    return "\n".join(lines)


def sampler_bench(args) -> dict:
    """CLI entry: the target shape on CUDA, a small smoke shape elsewhere."""
    if str(args.device).startswith("cuda"):
        # CORE_RUNNER_SAMPLER_SWEEP=1: also time other launch shapes (each compiles anew: minutes);
        # CORE_RUNNER_SAMPLER_TOP_P=1: top-p batches only (no one-program kernel to compile)
        # CORE_RUNNER_SAMPLER_SCALES="2,3": top-p also on flatter logits (N(0, s^2))
        scales = tuple(float(v) for v in os.environ.get("CORE_RUNNER_SAMPLER_SCALES", "").split(",") if v)
        res = run_sampler_bench(args.device, sweep=os.environ.get("CORE_RUNNER_SAMPLER_SWEEP") == "1",
                                one_program_cuts=os.environ.get("CORE_RUNNER_SAMPLER_TOP_P") != "1", scales=scales)
    else:
        res = run_sampler_bench(args.device, batch=8, vocab=2048, iters=2, warmup=1)
    print(format_sampler_result(res), flush=True)
    return {"sampler": res}
