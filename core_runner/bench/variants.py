"""Engine variants on the same workloads in one call: one ``LLM`` per variant (a shape, a
quantized config, an engine option such as ``kv_cache_dtype``), every workload of that
variant run on it with ``run_engine``, and the decode roofline beside each figure. The
stage scripts in benchmarks/ (fp8w, gemma3, ...) build on it.

``kv_read_split`` splits the KV bytes a decode step reads per token of context by layer
kind: full-attention layers read the whole context, a sliding-window layer at most its
window (``decode_roofline_tok_s(windowed_kv=...)``). ``fp8_resident_layers`` says which
layers hold their weights as float8_e4m3fn (by name pattern, layer indices folded).
"""
from __future__ import annotations

import argparse
import gc
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from core_runner.bench.roofline import decode_roofline_tok_s
from core_runner.bench.run import copy_bandwidth, engine_settings, run_engine
from core_runner.bench.workloads import Request, make_workload


def workload_parser(description: str) -> argparse.ArgumentParser:
    """The options of a bench script that runs workloads on engine variants (a script adds its own)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="shrunk sizes (CPU smoke test)")
    ap.add_argument("--root", default=None, help="where the config-only models go (default: the bench cache)")
    ap.add_argument("--json", default=None)
    return ap


def write_json(path: str | None, res: Any) -> Any:
    """``res`` written to ``path`` (when given) as the bench's JSON result; returns ``res``."""
    if path:
        Path(path).write_text(json.dumps(res, indent=1, default=str))
    return res


def variant_args(**given: Any) -> argparse.Namespace:
    """The options ``run_variant`` reads (the bench CLI's names), with the bench's defaults."""
    base = dict(device="cuda", dtype="bfloat16", num_requests=None, scale=1, enforce_eager=False, temperature=None,
                load_format="dummy", profile_steps=0, best_settings=False)
    return argparse.Namespace(**{**base, **given})


def fp8_resident_layers(model: torch.nn.Module) -> dict:
    """Modules holding resident fp8 weights (``fp8_block`` set), by name pattern with the
    layer index folded to ``*``, and the bytes of fp8 weights, their scales and the rest."""
    fp8, dense, fp8_bytes, scale_bytes = Counter(), Counter(), 0, 0
    for name, module in model.named_modules():
        if not hasattr(module, "fp8_block") or getattr(module, "weight", None) is None:
            continue
        pattern = re.sub(r"\.\d+\.", ".*.", name)
        if module.fp8_block is not None:
            fp8[pattern] += 1
            fp8_bytes += module.weight.numel() * module.weight.element_size()
            scale = module.weight_scale_inv
            scale_bytes += scale.numel() * scale.element_size()
        else:
            dense[pattern] += 1
    dtypes = Counter(str(p.dtype).replace("torch.", "") for p in model.parameters())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"fp8_modules": dict(fp8), "dense_fp8_capable_modules": dict(dense), "fp8_weight_bytes": fp8_bytes,
            "fp8_scale_bytes": scale_bytes, "other_weight_bytes": total - fp8_bytes,
            "parameter_dtypes": dict(dtypes)}


def kv_read_split(llm) -> tuple[int, list[tuple[int, int]]]:
    """(bytes per token of the full-attention layers, [(window, bytes per token), ...] of the
    sliding-window layers) of the engine's paged caches."""
    from core_runner.kv_cache_spec import PagedCacheSpec

    full, windowed = 0, Counter()
    for spec in llm.engine.runner.cache_specs():
        if not isinstance(spec, PagedCacheSpec):
            continue
        if spec.sliding_window is None:
            full += spec.bytes_per_token()
        else:
            windowed[spec.sliding_window] += spec.bytes_per_token()
    return full, sorted(windowed.items())


def weight_bytes(model: torch.nn.Module) -> int:
    """Parameters and the fp8 scale buffers: what a decode step streams."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(b.numel() * b.element_size() for name, b in model.named_buffers() if name.endswith("_scale_inv"))


def roofline_of(llm, workload: list[Request], bandwidth: float) -> float:
    mem = llm.engine.memory_report()
    full, windowed = kv_read_split(llm)
    return decode_roofline_tok_s(workload, weight_bytes(llm.engine.model), full, bandwidth, llm.config.max_num_seqs,
                                 mem.get("state_bytes_per_row", 0), windowed_kv=windowed)


def build_llm(model: str, args: argparse.Namespace, **llm_kwargs: Any):
    from core_runner import LLM

    opts, _ = engine_settings(args)
    return LLM(model, device=args.device, dtype=args.dtype, enforce_eager=args.enforce_eager,
               load_format=args.load_format, **{**opts, **llm_kwargs})


def release(llm) -> None:
    """Shut the engine down; its memory is freed once the caller drops its last reference
    and calls ``free_memory`` (this function's own reference cannot free it)."""
    llm.engine.shutdown()


def free_memory() -> None:
    """Collect the engines no one references any more (their reference cycles included) and
    hand their cached GPU blocks back, so that the next variant sizes its KV pool from what is
    really free."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_variant(model: str, workloads: list[str] | dict[str, list[Request]], args: argparse.Namespace,
                **llm_kwargs: Any) -> dict:
    """One engine of ``model`` (``llm_kwargs`` on top of the bench options in ``args``) and
    every workload on it: names of ``make_workload`` or {name: workload}. Returns {name:
    run_engine result + roofline}, with ``_engine`` (settings, memory report, fp8 layers)."""
    llm = build_llm(model, args, **llm_kwargs)
    try:
        out: dict[str, Any] = {"_engine": engine_facts(llm)}
        bw = copy_bandwidth(args.device) if str(args.device).startswith("cuda") else None
        if bw:
            out["_engine"]["copy_bw_gb_s"] = bw / 1e9
        items = workloads.items() if isinstance(workloads, dict) else (
            (name, make_workload(name, llm.engine.vocab_size, args.num_requests, scale=args.scale,
                                 temperature=args.temperature)) for name in workloads)
        for name, workload in items:
            res = run_engine(llm, workload, profile_steps=args.profile_steps)
            if bw:
                res["roofline_tok_s"] = roofline_of(llm, workload, bw)
                res["ratio_to_roofline"] = res["output_tok_s"] / res["roofline_tok_s"]
            out[name] = res
        return out
    finally:
        release(llm)
        del llm
        free_memory()


def engine_facts(llm) -> dict:
    c = llm.config
    return {"plan": repr(llm.engine.plan), "kv_cache_dtype": c.kv_cache_dtype, "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens, "max_model_len": c.max_model_len,
            "num_kv_blocks": llm.engine.num_blocks, "memory": llm.engine.memory_report(),
            "weight_bytes": weight_bytes(llm.engine.model), "fp8": fp8_resident_layers(llm.engine.model)}


def ratio(a: dict, b: dict, key: str) -> float:
    """a[key] / b[key] (nan when either is missing or b's is 0)."""
    x, y = a.get(key), b.get(key)
    return x / y if x is not None and y else float("nan")


def summary_line(label: str, r: dict) -> str:
    roof = f", {r['ratio_to_roofline']:.2f} of roofline" if "ratio_to_roofline" in r else ""
    return (f"{label}: {r['output_tok_s']:,.0f} output tok/s, TPOT p50 {r['tpot_p50_ms']:.2f} ms, TTFT p50 "
            f"{r['ttft_p50_s']:.3f} s ({r['output_tokens']:,} tokens in {r['elapsed_s']:.1f} s{roof})")
