"""Profiling for ``core-runner bench --profile-steps N``: a second, untimed pass of the
workload with N decode steps under the torch profiler (GPU idle share, the kernels with the
most device time) and N more under cProfile (host functions); two prefill steps of the first
wave go under both at once (their wall time, stretched by both profilers, is reported too)."""
from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path

import torch


def profile_pass(eng, add_all, profile_steps: int, prof_at: int | None = None) -> dict:
    """The workload again, outside the clock: ``profile_steps`` decode steps under the torch
    profiler (GPU idle, top kernels), then as many under cProfile (host), then abort. The
    prefix cache is emptied first, so the prefill steps profiled compute their prompts as the
    timed pass did rather than hitting the blocks it left cached. The decode steps start at
    step ``prof_at`` (default 100 with >= 64 requests, else 10): a workload whose prompts
    take longer to prefill passes a later one."""
    eng.reset_prefix_cache()
    add_all("p")
    if prof_at is None:
        prof_at = 100 if len(eng.scheduler.requests) >= 64 else 10
    found: dict = {}
    prof = host = None
    for step in range(prof_at + 2 * profile_steps):
        if not eng.has_unfinished_requests():
            break
        if step == 2 and prof_at > 10:  # prefill-heavy steps of the first wave: device and host
            pre, pre_host, pre_t0 = _start_profile(), cProfile.Profile(), time.perf_counter()
            pre_host.enable()
        if step == 4 and prof_at > 10:
            pre_host.disable()
            found["prefill_step_ms_profiled"] = 1e3 * (time.perf_counter() - pre_t0) / 2
            stats = _stop_profile(pre, 2)
            found["prefill_top_kernels"] = stats.get("top_kernels", [])
            found["prefill_gpu_idle_frac"] = stats.get("gpu_idle_frac", float("nan"))
            found["prefill_host_top"] = _host_top(pre_host, 2)
        if step == prof_at:
            prof = _start_profile()
        elif step == prof_at + profile_steps:
            found.update(_stop_profile(prof, profile_steps))
            prof = None
            host = cProfile.Profile()
            host.enable()
        eng.step()
    if prof is not None:
        found.update(_stop_profile(prof, profile_steps))
    if host is not None:
        host.disable()
        found["host_top"] = _host_top(host, profile_steps)
    for rid in list(eng.scheduler.requests):
        eng.abort_request(rid)
    while eng.has_unfinished_requests():
        eng.step()
    return found


def profile_call(fn, count_steps=None) -> dict:
    """``fn()`` once under the torch profiler and cProfile together: GPU idle share, top kernels
    and host functions, and the wall it took under both profilers. ``count_steps(hook)`` may
    register a per-step hook and return its remover: the figures are then per engine step (and
    the step count is reported), else per call."""
    steps = [0]
    remove = count_steps(lambda *_: steps.__setitem__(0, steps[0] + 1)) if count_steps else None
    dev, host, t0 = _start_profile(), cProfile.Profile(), time.perf_counter()
    host.enable()
    try:
        fn()
    finally:
        host.disable()
        if remove is not None:
            remove()
    per = max(steps[0], 1)
    found = _stop_profile(dev, per)
    found.update(wall_ms_profiled=1e3 * (time.perf_counter() - t0), host_top=_host_top(host, per))
    if count_steps:
        found["steps"] = steps[0]
    return found


def host_lines(rows: list[dict], label: str) -> list[str]:
    return [f"    {label} {k['tot_ms_per_step']:6.2f} ms/step own, {k['cum_ms_per_step']:6.2f} cum "
            f"x{k['calls_per_step']:7.1f}  {k['func']}" for k in rows]


def kernel_lines(rows: list[dict], label: str) -> list[str]:
    return [f"    {label}{k['us_per_step']:8.1f} us/step x{k['calls_per_step']:5.1f}  {k['name']}" for k in rows]


def _host_top(prof: "cProfile.Profile", num_steps: int, n: int = 15) -> list[dict]:
    """The functions with the most host time of their own, in ms per step."""
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:n]  # (cc, nc, tottime, cumtime, callers)
    return [{"func": f"{Path(k[0]).name}:{k[1]}({k[2]})", "tot_ms_per_step": 1e3 * v[2] / num_steps,
             "cum_ms_per_step": 1e3 * v[3] / num_steps, "calls_per_step": v[1] / num_steps} for k, v in rows]


def _start_profile():
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    return prof


def _stop_profile(prof, num_steps: int = 1) -> dict:
    """GPU idle share over the profiled steps (1 - union of kernel intervals / span) and
    the kernels that took the most device time, in microseconds per step."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.__exit__(None, None, None)
    cuda = [e for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    spans = sorted((e.time_range.start, e.time_range.end) for e in cuda)
    per_name: dict[str, list[float]] = {}
    for e in cuda:
        acc = per_name.setdefault(e.name[:90], [0.0, 0])
        acc[0] += e.time_range.end - e.time_range.start
        acc[1] += 1
    top = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:15]
    kernels = [{"name": k, "us_per_step": v[0] / num_steps, "calls_per_step": v[1] / num_steps} for k, v in top]
    if not spans:
        return {"gpu_idle_frac": float("nan")}
    busy, cur_s, cur_e = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = spans[-1][1] - spans[0][0]
    return {"gpu_idle_frac": 1 - busy / span, "profiled_span_ms": span / 1e3, "top_kernels": kernels,
            "gpu_busy_ms_per_step": busy / 1e3 / num_steps}
