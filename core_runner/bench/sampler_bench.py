"""``core-runner bench --sampler``: the sampler alone on a large batch of logits.

At batch 1024 x vocab 151,936 fp32, logits N(0, 4^2), it times temperature 0.7 + top-p 0.9
and temperature alone through ``sample_inputs`` (Triton kernels on a GPU) and sets them
against one read of the logits at the device's copy bandwidth (a copy reads and writes
each byte once, so a read takes half a copy: figures are given in "reads") and against
``torch.softmax`` + ``torch.multinomial``. It also counts the rows whose token differs from
the torch reference (0 expected), the rows that took the fallback, and, with
CORE_RUNNER_SAMPLER_SCALES="2,1", the same on flatter logits N(0, s^2). On the CPU the same
code runs at a small shape as a smoke test (the torch path; its numbers mean little).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import torch

from core_runner.sample.gumbel import Draw
from core_runner.sample.sampler import StepInputs, draw_tokens, sample_inputs
from core_runner.sample.top_k_top_p import Cuts


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device, iters: int, warmup: int) -> float:
    """Median seconds per call: on CUDA, events around ``iters`` back-to-back calls (five
    rounds); elsewhere wall time with a sync per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    rounds = []
    for _ in range(5 if device.type == "cuda" else 1):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            rounds.append(a.elapsed_time(b) / 1e3 / iters)
        else:
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            rounds.append((time.perf_counter() - t) / iters)
    return statistics.median(rounds)


def _graph_ms(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """GPU ms of fn replayed from a CUDA graph (no host gaps between its launches)."""
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    return 1e3 * _time(g.replay, device, iters, 3)


def _peak_extra_mib(fn: Callable[[], object], device: torch.device) -> float | None:
    """MiB allocated at peak during one call beyond what was live before it (CUDA)."""
    if device.type != "cuda":
        return None
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    _sync(device)
    del out
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def bench_inputs(batch: int, dev: torch.device, temperature: float = 0.7, p: float = 1.0) -> StepInputs:
    """Every row sampled at one temperature (seed = row, position 100), top-p p (none at 1)."""
    draw = Draw(torch.full((batch,), 1.0 / temperature, device=dev), torch.arange(batch, device=dev),
                torch.full((batch,), 100, dtype=torch.int64, device=dev))
    cuts = None
    if p < 1.0:
        cuts = Cuts(torch.full((batch,), -1, dtype=torch.int32, device=dev), torch.full((batch,), p, device=dev),
                    torch.full((batch,), float("-inf"), device=dev))
    return StepInputs(draw, cuts)


def _check(logits: torch.Tensor, m: StepInputs, use_triton: bool) -> tuple[int, int | None]:
    """(rows off the torch reference, rows that took the fallback), 64 rows at a time."""
    from core_runner.sample.top_k_top_p_triton import cut_sample_triton

    off, fallback = 0, 0 if use_triton else None
    d, c = m.draw, m.cuts
    for s in range(0, logits.shape[0], 64):
        part = slice(s, s + 64)
        sub_d = Draw(d.inv_temp[part], d.seeds[part], d.positions[part])
        sub_c = Cuts(c.top_k[part], c.top_p[part], c.log_min_p[part])
        want = draw_tokens(logits[part], sub_d, sub_c, use_triton=False)
        if use_triton:
            got, flags = cut_sample_triton(logits[part], sub_d.inv_temp, sub_d.seeds, sub_d.positions, sub_c.top_k,
                                           sub_c.top_p, sub_c.log_min_p, with_flags=True)
            fallback += int(flags.sum())
            off += int((got != want).sum())
    return off, fallback


def run_sampler_bench(device: str = "cuda", batch: int = 1024, vocab: int = 151936, temperature: float = 0.7,
                      top_p: float = 0.9, iters: int = 20, warmup: int = 3, scales: tuple[float, ...] = ()) -> dict:
    dev = torch.device(device)
    use_triton = dev.type == "cuda"
    logits = torch.randn(batch, vocab, generator=torch.Generator(device=dev).manual_seed(0), device=dev) * 4.0
    top_p_in, temp_in = bench_inputs(batch, dev, temperature, top_p), bench_inputs(batch, dev, temperature)
    dst = torch.empty_like(logits)
    fns = {
        "top_p": lambda: sample_inputs(logits, top_p_in, use_triton).sampled,
        "temperature_only": lambda: sample_inputs(logits, temp_in, use_triton).sampled,
        "torch_softmax_multinomial": lambda: torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1),
        "copy": lambda: dst.copy_(logits),
    }
    ms = {k: 1e3 * _time(f, dev, iters, warmup) for k, f in fns.items()}
    read = ms["copy"] / 2
    nbytes = logits.numel() * logits.element_size()
    off, fallback = _check(logits, top_p_in, use_triton)
    res = {
        "device": str(dev), "batch": batch, "vocab": vocab, "temperature": temperature, "top_p": top_p,
        "logits_mib": nbytes / 2**20, "copy_bw_gb_s": 2 * nbytes / ms["copy"] / 1e6, "logits_read_ms": read,
        "sampler_top_p_ms": ms["top_p"], "sampler_temperature_only_ms": ms["temperature_only"],
        "torch_softmax_multinomial_ms": ms["torch_softmax_multinomial"],
        "ratio_to_read": ms["top_p"] / read, "temperature_only_reads": ms["temperature_only"] / read,
        "speedup_vs_torch": ms["torch_softmax_multinomial"] / ms["top_p"],
        "top_p_rows_off_reference": off, "top_p_fallback_rows": fallback,
        "top_p_graph_ms": _graph_ms(fns["top_p"], dev, iters) if use_triton else None,
        "top_p_peak_extra_mib": _peak_extra_mib(fns["top_p"], dev),
        "torch_softmax_multinomial_peak_extra_mib": _peak_extra_mib(fns["torch_softmax_multinomial"], dev),
    }
    if scales:
        res["top_p_by_scale"] = {}
        for s in scales:
            x = logits * (s / 4.0)
            off, fallback = _check(x, top_p_in, use_triton)
            res["top_p_by_scale"][str(s)] = {
                "ms": 1e3 * _time(lambda x=x: sample_inputs(x, top_p_in, use_triton).sampled, dev, iters, warmup),
                "rows_off_reference": off, "fallback_rows": fallback}
            del x
    return res


def format_sampler_result(r: dict) -> str:
    lines = [
        f"sampler [{r['batch']} x {r['vocab']}] fp32 on {r['device']}: temperature {r['temperature']} + top-p "
        f"{r['top_p']} {r['sampler_top_p_ms']:.3f} ms = {r['ratio_to_read']:.2f} reads; temperature only "
        f"{r['sampler_temperature_only_ms']:.3f} ms = {r['temperature_only_reads']:.2f} reads",
        f"  one read at copy bandwidth ({r['copy_bw_gb_s']:.0f} GB/s): {r['logits_read_ms']:.3f} ms",
        f"  torch softmax + multinomial: {r['torch_softmax_multinomial_ms']:.3f} ms -> "
        f"{r['speedup_vs_torch']:.2f}x faster",
        f"  top-p rows off the torch reference: {r['top_p_rows_off_reference']}; fallback rows: "
        f"{r['top_p_fallback_rows']}",
    ]
    if r.get("top_p_graph_ms") is not None:
        lines.append(f"  top-p from a CUDA graph: {r['top_p_graph_ms']:.3f} ms")
    if r.get("top_p_peak_extra_mib") is not None:
        lines.append(f"  peak extra memory: sampler {r['top_p_peak_extra_mib']:.1f} MiB, torch "
                     f"{r['torch_softmax_multinomial_peak_extra_mib']:.1f} MiB (logits {r['logits_mib']:.0f} MiB)")
    for s, v in r.get("top_p_by_scale", {}).items():
        lines.append(f"  top-p on N(0, {s}^2) logits: {v['ms']:.3f} ms, rows off {v['rows_off_reference']}, "
                     f"fallback rows {v['fallback_rows']}")
    return "\n".join(lines)


def sampler_bench(args) -> dict:
    """CLI entry: the target shape on CUDA, a small smoke shape elsewhere.
    CORE_RUNNER_SAMPLER_SCALES="2,1": top-p also on flatter logits N(0, s^2)."""
    if str(args.device).startswith("cuda"):
        scales = tuple(float(v) for v in os.environ.get("CORE_RUNNER_SAMPLER_SCALES", "").split(",") if v)
        res = run_sampler_bench(args.device, scales=scales)
    else:
        res = run_sampler_bench(args.device, batch=8, vocab=2048, iters=2, warmup=1)
    print(format_sampler_result(res), flush=True)
    return {"sampler": res}
