"""``core-runner bench``: workloads W1/W2/W3 on a Qwen3-0.6B-shaped model (random bf16
weights) or any checkpoint, timing output tok/s, TTFT and TPOT, against the roofline
and, with ``--peer``, the transformers continuous-batching peer in the same call.

Every run also counts the prompt tokens the engine computed (``PrefillCounter``) and the
prefix cache's hits; ``--prefix-caching on off`` runs each workload with the cache on, then
off, and compares the two (W3 is the workload built for it). ``--speculative-config off
'{"method": "ngram", ...}'`` does the same for speculative decoding (``core_runner.bench.spec``:
mean TPOT, acceptance, outputs compared with ``off``; W2R is the workload built for it)."""
from __future__ import annotations

import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from core_runner.bench.profile import host_lines, kernel_lines, profile_pass
from core_runner.bench.roofline import decode_roofline_tok_s
from core_runner.bench.shapes import config_only_checkpoint
from core_runner.bench.spec import (
    OFF,
    SpecVariant,
    compare_spec,
    describe_spec,
    format_spec_comparison,
    format_spec_line,
    spec_counters,
    spec_metrics,
    spec_variants,
)
from core_runner.bench.workloads import make_random_checkpoint, make_workload, qwen3_0p6b_config
from core_runner.executor.gc_heap import paused_gc

logger = logging.getLogger(__name__)

# The settings that gave the best figures on an H200 (W1 79,420 tok/s, W2 23,306 with
# kv_cache_memory_fraction 0.8 of the free memory, about 0.8 of the GPU's total); opt-in
# with --best-settings, since the engine's defaults are what a user gets.
BEST_SETTINGS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.8}
_TUNABLE = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization",
            "tensor_parallel_size", "max_cudagraph_capture_size", "kv_cache_dtype")


def engine_settings(args) -> tuple[dict, str]:
    """The LLM options of a bench run and where they came from: the engine's defaults (only
    model, dtype and device given), or BEST_SETTINGS with --best-settings; flags given
    explicitly win either way."""
    opts = dict(BEST_SETTINGS) if getattr(args, "best_settings", False) else {}
    source = "best settings" if opts else "engine defaults"
    given = {k: getattr(args, k) for k in _TUNABLE if getattr(args, k, None) is not None}
    if given:
        source += " + flags " + ", ".join(f"{k}={v}" for k, v in given.items())
    return {**opts, **given}, source


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def default_checkpoint(device: str) -> str:
    root = Path(os.environ.get("CORE_RUNNER_CACHE", Path.home() / ".cache" / "core-runner"))
    path = root / "bench-qwen3-0.6b-random-bf16"
    if not (path / "config.json").is_file():
        logger.info("building the random Qwen3-0.6B-shaped checkpoint in %s", path)
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root))
        make_random_checkpoint(tmp, qwen3_0p6b_config(), dtype=torch.bfloat16, device=device)
        os.replace(tmp, path)
    return str(path)


def copy_bandwidth(device: str, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return 2 * nbytes * 10 / (time.perf_counter() - t)


class PrefillCounter:
    """A step hook (``engine.debug.on_step``) adding up the prompt tokens the engine scheduled:
    what it computed, so a prefix cache hit is left out and a prompt computed again after a
    preemption counts again. Only requests still in their prompt are visited."""

    def __init__(self) -> None:
        self.tokens = 0
        self._in_prompt: dict[str, int] = {}  # request id -> prompt length

    def __call__(self, out) -> None:
        for new in out.new_reqs:  # admissions, a resumed request's included
            self._in_prompt[new.req_id] = new.num_prompt_tokens
        for rid, num_prompt in list(self._in_prompt.items()):
            n = out.num_scheduled_tokens.get(rid)
            if not n:
                continue
            start = out.num_computed_tokens[rid]
            self.tokens += max(0, min(start + n, num_prompt) - start)
            if start + n >= num_prompt:
                del self._in_prompt[rid]


def run_engine(llm, workload, profile_steps: int = 0, keep_outputs: bool = False) -> dict:
    """Time ``workload`` on ``llm``; ``keep_outputs`` adds every request's output token ids
    (``output_token_ids``, in workload order) for comparing runs."""
    from core_runner import SamplingParams

    eng = llm.engine
    # warm-up outside the clock: a full-budget dummy step (compiles the large prefill
    # shapes) and a few short requests through the whole path (sampler, graphs)
    eng.dummy_run(min(eng.config.max_num_seqs, 64), eng.config.max_num_batched_tokens)
    llm.generate([p[:16] for p, _, _ in workload[:8]],
                 SamplingParams(max_tokens=8, ignore_eos=True, temperature=workload[0][2]), use_tqdm=False)
    if eng.runner.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    llm.reset_prefix_cache()  # the warm-up's prompts must not be hits
    sched = eng.scheduler
    queries0, hits0 = sched.prefix_cache_queries, sched.prefix_cache_hits
    spec0 = spec_counters(sched)  # the warm-up verified proposals too
    prefill = PrefillCounter()
    remove_hook = eng.debug.on_step(prefill)

    def add_all(tag: str) -> None:
        for i, (prompt, out_len, temp) in enumerate(workload):
            eng.add_request(prompt, SamplingParams(max_tokens=out_len, temperature=temp, ignore_eos=True, seed=i),
                            req_id=f"{tag}{i}")

    # the collector paused as LLM.generate pauses it (core_runner/executor/gc_heap.py)
    with paused_gc():
        start = time.perf_counter()
        add_all("b")
        outs, steps, step_s, slow = [], 0, [], []
        while eng.has_unfinished_requests():
            t0 = time.perf_counter()
            outs += eng.step()
            step_s.append(time.perf_counter() - t0)
            if step_s[-1] > 0.1 and len(slow) < 10:  # JIT compiles or stalls inside the clock
                last = eng.core.in_flight[-1][0] if eng.core.in_flight else None
                slow.append({"step": steps, "ms": 1e3 * step_s[-1],
                             "reqs": len(last.num_scheduled_tokens) if last else 0,
                             "tokens": sum(last.num_scheduled_tokens.values()) if last else 0})
            steps += 1
        if eng.runner.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    remove_hook()
    n_out = sum(len(o.token_ids) for o in outs)
    expect = sum(o for _, o, _ in workload)
    if n_out != expect:
        raise RuntimeError(f"generated {n_out} tokens, the workload asks for {expect}")
    ttft = [o.first_token_time - start for o in outs]
    tpot = [(o.finish_time - o.first_token_time) / (len(o.token_ids) - 1) for o in outs if len(o.token_ids) > 1]
    res = {
        "output_tok_s": n_out / elapsed, "elapsed_s": elapsed, "output_tokens": n_out, "steps": steps,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
        "tpot_mean_ms": 1e3 * statistics.fmean(tpot) if tpot else float("nan"),
        "greedy": all(temp == 0 for _, _, temp in workload),
        "preemptions": eng.scheduler.num_preemptions,
        "step_ms_p50": 1e3 * percentile(step_s, 50), "step_ms_p99": 1e3 * percentile(step_s, 99),
        "step_ms_max": 1e3 * max(step_s), "step_ms_mean": 1e3 * statistics.fmean(step_s), "slow_steps": slow,
        "prefix_caching": eng.plan.prefix_caching, "prompt_tokens": sum(len(p) for p, _, _ in workload),
        "prefill_tokens_computed": prefill.tokens,
        "prefix_cache_queries": sched.prefix_cache_queries - queries0,
        "prefix_cache_hits": sched.prefix_cache_hits - hits0,
    }
    spec = eng.config.speculative_config
    res["speculative_config"] = describe_spec(spec)
    if spec is not None:
        res.update(spec_metrics(spec0, spec_counters(sched)))
    if keep_outputs:
        by_id = {o.request_id: list(o.token_ids) for o in outs}
        res["output_token_ids"] = [by_id[f"b{i}"] for i in range(len(workload))]
    if eng.runner.device.type == "cuda":
        res["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if profile_steps:
        res.update(profile_pass(eng, add_all, profile_steps))
    return res


def run_peer(model: str, workload_name: str, num_requests: int | None, device: str, timeout: int,
             scale: int = 1) -> dict:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"
    if not script.is_file():
        return {"error": f"peer script not found at {script} (run from a source checkout)"}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, str(script), "--model", model, "--workload", workload_name,
               "--device", device, "--json", f.name, "--timeout", str(max(60, timeout - 60)), "--scale", str(scale)]
        if num_requests:
            cmd += ["--num-requests", str(num_requests)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"peer timed out after {timeout}s"}
        try:
            return json.loads(Path(f.name).read_text())
        except (OSError, json.JSONDecodeError):
            return {"error": f"peer failed (rc={proc.returncode}): {proc.stderr[-2000:]}"}


_PREFIX_CACHING = {"on": True, "off": False}


def prefix_caching_modes(given: list[str] | None) -> list[bool | None]:
    """``--prefix-caching`` values as ``enable_prefix_caching`` settings, in the order given
    (repeats dropped); none given is one run with the engine's default (None)."""
    if not given:
        return [None]
    modes: list[bool | None] = []
    for value in given:
        if value not in _PREFIX_CACHING:
            raise ValueError(f"--prefix-caching takes on or off, got {value!r}")
        if _PREFIX_CACHING[value] not in modes:
            modes.append(_PREFIX_CACHING[value])
    return modes


def compare_prefix_caching(on: dict, off: dict) -> dict:
    """The same workload with the prefix cache on and off (run_engine results that kept their
    outputs): prompt tokens computed, hits, tok/s, and how many requests' outputs agree."""
    same = sum(a == b for a, b in zip(on["output_token_ids"], off["output_token_ids"]))
    return {
        "prompt_tokens": on["prompt_tokens"],
        "prefill_tokens_computed_on": on["prefill_tokens_computed"],
        "prefill_tokens_computed_off": off["prefill_tokens_computed"],
        "prefill_tokens_off_over_on": off["prefill_tokens_computed"] / max(1, on["prefill_tokens_computed"]),
        "prefix_cache_hits_on": on["prefix_cache_hits"],
        "output_tok_s_on": on["output_tok_s"], "output_tok_s_off": off["output_tok_s"],
        "output_tok_s_on_over_off": on["output_tok_s"] / off["output_tok_s"],
        "identical_outputs": same, "num_requests": len(on["output_token_ids"]),
    }


def bench(args) -> dict:
    """Every workload of ``args.workload`` once per ``--prefix-caching`` mode and
    ``--speculative-config`` variant; results keyed by workload, with
    ``_prefix_caching_on|off`` and / or ``_spec_<label>`` appended where a flag gives several
    values, and the comparisons ``..._prefix_caching_on_vs_off`` and ``..._spec_<label>_vs_off``."""
    device = args.device
    load_format = getattr(args, "load_format", None) or "auto"
    shape = getattr(args, "shape", None)
    if shape is not None and load_format != "dummy":
        raise ValueError(f"--shape {shape} builds a config-only model: it needs --load-format dummy")
    modes = prefix_caching_modes(getattr(args, "prefix_caching", None))
    specs = spec_variants(getattr(args, "speculative_config", None))  # bad values fail before any model loads
    model = args.model or (config_only_checkpoint(shape) if shape else default_checkpoint(device))
    results = {}
    opts, source = engine_settings(args)
    compare = len(modes) > 1 or len(specs) > 1

    def pc_part(mode: bool | None) -> str:
        return "" if len(modes) == 1 else f"_prefix_caching_{'on' if mode else 'off'}"

    def spec_part(spec: SpecVariant) -> str:
        return "" if len(specs) == 1 else f"_spec_{spec.label}"

    for name in args.workload:
        runs = {}
        for mode in modes:
            for spec in specs:
                key = name + pc_part(mode) + spec_part(spec)
                res = _bench_workload(model, name, args, opts, source, mode, spec.config, keep_outputs=compare)
                # the peer has neither prefix cache nor speculation to switch: it runs once, beside the last run
                last = mode == modes[-1] and spec == specs[-1]
                if last and args.peer is not None and (not args.peer or name in args.peer):
                    peer = run_peer(model, name, args.num_requests, device, args.peer_timeout,
                                    getattr(args, "scale", 1))
                    res["peer"] = peer
                    if peer.get("output_tok_s"):
                        res["ratio_to_peer"] = res["output_tok_s"] / peer["output_tok_s"]
                runs[mode, spec.label] = results[key] = res
                print(format_result(key, res), flush=True)
        for spec in specs if True in modes and False in modes else ():
            cmp = compare_prefix_caching(runs[True, spec.label], runs[False, spec.label])
            results[f"{name}{spec_part(spec)}_prefix_caching_on_vs_off"] = cmp
            print(format_comparison(name + spec_part(spec), cmp), flush=True)
        for mode in modes if any(s.label == OFF for s in specs) else ():
            for spec in specs:
                if spec.label != OFF:
                    key = name + pc_part(mode) + spec_part(spec)
                    cmp = results[f"{key}_vs_off"] = compare_spec(runs[mode, spec.label], runs[mode, OFF])
                    print(format_spec_comparison(key, cmp), flush=True)
        for res in runs.values():
            res.pop("output_token_ids", None)  # compared; too long for the JSON report
    return results


def _bench_workload(model: str, name: str, args, opts: dict, source: str, prefix_caching: bool | None,
                    speculative_config: dict | None, keep_outputs: bool) -> dict:
    from core_runner import LLM

    device = args.device
    llm = LLM(model, device=device, dtype=args.dtype, enforce_eager=args.enforce_eager,
              enable_expert_parallel=bool(getattr(args, "enable_expert_parallel", False)),
              enable_prefix_caching=prefix_caching, load_format=getattr(args, "load_format", None) or "auto",
              speculative_config=speculative_config, **opts)
    workload = make_workload(name, llm.engine.vocab_size, args.num_requests, scale=getattr(args, "scale", 1),
                             temperature=getattr(args, "temperature", None))
    res = run_engine(llm, workload, profile_steps=args.profile_steps, keep_outputs=keep_outputs)
    c = llm.config
    res["settings"] = {"source": source, "max_model_len": c.max_model_len, "max_num_seqs": c.max_num_seqs,
                       "max_num_batched_tokens": c.max_num_batched_tokens, "block_size": c.block_size,
                       "gpu_memory_utilization": c.gpu_memory_utilization,
                       "kv_cache_memory_fraction": c.kv_cache_memory_fraction,
                       "tensor_parallel_size": c.tensor_parallel_size,
                       "max_cudagraph_capture_size": c.max_cudagraph_capture_size, "kv_cache_dtype": c.kv_cache_dtype,
                       "enable_expert_parallel": c.enable_expert_parallel,
                       "num_kv_blocks": llm.engine.num_blocks}
    mem = llm.engine.memory_report()
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
    res["plan"] = repr(llm.engine.plan)
    if device.startswith("cuda"):
        bw = copy_bandwidth(device)
        res["copy_bw_gb_s"] = bw / 1e9
        # a copy moves 2 bytes of traffic per byte copied; bw already counts both,
        # and it is the ceiling for the bytes a decode step reads
        roof = decode_roofline_tok_s(workload, weight_bytes, mem["kv_bytes_per_token"], bw,
                                     c.max_num_seqs, mem.get("state_bytes_per_row", 0))
        res["roofline_tok_s"] = roof
        res["ratio_to_roofline"] = res["output_tok_s"] / roof
    llm.engine.shutdown()  # a tensor-parallel engine's group must go before the next one
    del llm
    # the engine's parts refer to each other (engine.debug, hooks): only the cycle collector
    # frees them, and the next engine sizes its KV pool from the memory left
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return res


def format_comparison(name: str, c: dict) -> str:
    return (f"{name} prefix caching on vs off: prompt tokens computed {c['prefill_tokens_computed_on']:,} vs "
            f"{c['prefill_tokens_computed_off']:,} of {c['prompt_tokens']:,} "
            f"({c['prefill_tokens_off_over_on']:.2f}x fewer), cache hits {c['prefix_cache_hits_on']:,} tokens; "
            f"{c['output_tok_s_on']:,.0f} vs {c['output_tok_s_off']:,.0f} output tok/s "
            f"({c['output_tok_s_on_over_off']:.2f}x); identical outputs {c['identical_outputs']}/{c['num_requests']}")


def format_result(name: str, r: dict) -> str:
    lines = [f"{name}: {r['output_tok_s']:,.0f} output tok/s ({r['output_tokens']} tokens in {r['elapsed_s']:.2f} s, "
             f"{r['steps']} steps, {r['preemptions']} preemptions)"]
    st = r.get("settings")
    if st:
        lines.append(f"  settings ({st['source']}): max_num_seqs {st['max_num_seqs']}, max_num_batched_tokens "
                     f"{st['max_num_batched_tokens']}, max_model_len {st['max_model_len']}, KV {st['num_kv_blocks']} "
                     f"blocks (gpu_memory_utilization {st['gpu_memory_utilization']})")
    if "prefill_tokens_computed" in r:
        lines.append(f"  prefix caching {'on' if r['prefix_caching'] else 'off'}: {r['prefill_tokens_computed']:,} "
                     f"of {r['prompt_tokens']:,} prompt tokens computed, cache hits {r['prefix_cache_hits']:,} of "
                     f"{r['prefix_cache_queries']:,} tokens looked up")
    if r.get("speculative_config"):
        lines.append(format_spec_line(r))
    lines += [
             f"  TTFT p50 {r['ttft_p50_s']:.3f} s p99 {r['ttft_p99_s']:.3f} s | "
             f"TPOT mean {r.get('tpot_mean_ms', float('nan')):.2f} ms p50 {r['tpot_p50_ms']:.2f} ms "
             f"p99 {r['tpot_p99_ms']:.2f} ms"]
    if "peak_gpu_mem_gib" in r:
        lines.append(f"  peak GPU memory {r['peak_gpu_mem_gib']:.1f} GiB")
    if "roofline_tok_s" in r:
        lines.append(f"  roofline {r['roofline_tok_s']:,.0f} tok/s (copy bw {r['copy_bw_gb_s']:.0f} GB/s): "
                     f"ratio {r['ratio_to_roofline']:.2f}")
    if "step_ms_p50" in r:
        lines.append(f"  step wall time mean {r.get('step_ms_mean', float('nan')):.2f} ms "
                     f"p50 {r['step_ms_p50']:.2f} ms p99 {r['step_ms_p99']:.2f} ms max {r['step_ms_max']:.1f} ms")
        for st in r.get("slow_steps", [])[:5]:
            lines.append(f"    slow step {st['step']}: {st['ms']:.0f} ms ({st['reqs']} reqs, {st['tokens']} tokens)")
    if "gpu_idle_frac" in r:
        lines.append(f"  GPU idle over profiled decode steps: {100 * r['gpu_idle_frac']:.1f}% "
                     f"(busy {r.get('gpu_busy_ms_per_step', float('nan')):.2f} ms/step)")
        lines += host_lines(r.get("host_top", [])[:12], "host")
        if "prefill_gpu_idle_frac" in r:
            lines.append(f"  prefill steps under both profilers: {r['prefill_step_ms_profiled']:.1f} ms each, "
                         f"GPU idle {100 * r['prefill_gpu_idle_frac']:.1f}%")
            lines += host_lines(r.get("prefill_host_top", [])[:8], "prefill host")
        lines += kernel_lines(r.get("prefill_top_kernels", [])[:6], "prefill ")
        lines += kernel_lines(r.get("top_kernels", [])[:10], "")
    if "peer" in r:
        p = r["peer"]
        if p.get("output_tok_s"):
            lines.append(f"  peer (transformers {p.get('config')}): {p['output_tok_s']:,.0f} tok/s -> "
                         f"ratio {r['ratio_to_peer']:.1f}x")
        else:
            lines.append(f"  peer failed: {p.get('error')}")
    return "\n".join(lines)
