"""Peer measurement: Hugging Face transformers continuous batching on our benchmark workloads.

``run_hf_peer`` loads a checkpoint with transformers and serves a workload from
``core_runner.bench.workloads`` through transformers' own continuous-batching engine, so the main
benchmark can print core-runner / transformers throughput ratios.

Configurations are tried strongest first; the first that completes is reported (``"config"``)
together with every earlier failure (``"attempts"``):

1. ``cb-manager/<attn>``: the continuous-batching manager (``model.init_continuous_batching``,
   the engine behind ``model.generate_batch``) fed request by request through
   ``manager.add_request(..., max_new_tokens=<that request's length>, eos_token_id=-1)``, so
   every request gets exactly its own output length with EOS ignored, and the whole workload is
   in flight at once. ``<attn>`` goes through ``flash_attention_3`` / ``flash_attention_2`` (only
   when the package is importable and CUDA is up), ``sdpa``, ``paged|sdpa`` (the pre-5.2x name)
   and ``paged|eager``. With ``compile_level > 0`` each is first tried with
   ``ContinuousBatchingConfig.default_compile_level`` set.
2. ``cb-generate_batch/<attn>``: ``model.generate_batch`` itself. It takes a single
   ``max_new_tokens`` per call, so requests are sorted by output length and split into at most
   ``_MAX_BUCKETS`` buckets run one after another, each with its bucket's largest length. Only the
   requested tokens are counted as output (``"wasted_tokens"`` holds the overshoot).
3. ``generate-padded/<attn>``: no continuous batching at all: left-padded ``model.generate`` in
   fixed-size batches sorted by length (``"error"`` then carries why continuous batching failed).

Timing covers only the timed workload: model loading, CUDA-graph capture (``manager.warmup``)
and a short warm-up on a few of the workload's requests happen before the clock starts.

Notes on transformers versions (read from the 5.17.0 and 5.24.0 sources):

* Both have ``ContinuousMixin.init_continuous_batching(generation_config,
  continuous_batching_config, workload_hints)``, ``ContinuousBatchingManager.add_request(input_ids,
  request_id, max_new_tokens, streaming, record_timestamps, eos_token_id, **logit_processor_kwargs)``,
  ``get_result(request_id, timeout)``, ``warmup()``, ``start()``, ``stop(block, timeout,
  keep_for_next_session, hard_stop)`` and ``generate_batch(inputs, generation_config,
  continuous_batching_config, ..., warmup, max_new_tokens=...)``.
* ``ContinuousBatchingConfig``: 5.17 has ``block_size`` (default 256); 5.24 renamed it
  ``page_size`` and keeps ``block_size`` as a deprecated alias. ``num_blocks``,
  ``max_batch_tokens``, ``max_memory_percent``, ``default_compile_level``, ``seed`` and
  ``scheduler_type`` exist in both; ``auto_switch_to_flash`` only in 5.24. Fields are
  feature-detected with ``dataclasses.fields``.
* Attention: 5.17 turns ``sdpa`` / ``eager`` / ``flash_attention_*`` into ``paged|<impl>`` itself;
  5.24 uses ``sdpa`` and ``flash_attention_*`` as they are (``paged|`` only for ``paged|eager``,
  other ``paged|`` names are stripped with a deprecation warning). Both switch to flash attention
  by themselves when ``flash_attn`` (FA2) or ``flash_attn_interface`` (FA3) is installed.
* Continuous batching also runs on CPU (no CUDA graphs there); without ``psutil`` transformers
  cannot measure host memory, so on CPU the cache size is always set explicitly here.

Run the peer in its own process (the CLI, or ``run_hf_peer_subprocess``) when the same process
has held GPU memory for something else: transformers sizes its KV cache from the free memory
(90% of it by default).

CLI::

    python benchmarks/peers.py --model PATH --workload W1|W2 [--num-requests N] [--scale S]
        [--device cuda] [--max-batch-tokens M] [--timeout S] --json out.json
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import inspect
import json
import logging
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# The GPU machine has no network: never let transformers / huggingface_hub try to reach the Hub
# (e.g. the `kernels` flash-attention fallback probe).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core_runner.bench.workloads import WORKLOADS, make_workload, workload_summary  # noqa: E402

logger = logging.getLogger("benchmarks.peers")

_MAX_BUCKETS = 4  # generate_batch fallback: at most this many max_new_tokens groups
_DEFAULT_WARMUP_REQUESTS = 4
_WARMUP_MAX_NEW_TOKENS = 16
_DEFAULT_PADDED_BATCH = 64
_CPU_DEFAULT_MAX_BATCH_TOKENS = 256
_POLL_S = 0.5


class PeerTimeout(RuntimeError):
    """The timed run did not finish within ``timeout_s``."""


# --------------------------------------------------------------------------------------------- #
# Public entry points
# --------------------------------------------------------------------------------------------- #


def run_hf_peer(
    model_path: str,
    workload: list,
    device: str = "cuda",
    max_batch_tokens: int | None = None,
    timeout_s: float | None = None,
    *,
    num_blocks: int | None = None,
    compile_level: int = 0,
    dtype: str = "bfloat16",
    warmup_requests: int = _DEFAULT_WARMUP_REQUESTS,
    padded_batch_size: int | None = None,
    modes: tuple[str, ...] = ("cb-manager", "cb-generate_batch", "generate-padded"),
) -> dict:
    """Serve ``workload`` (``[(prompt_ids, output_len, temperature), ...]``) with transformers.

    Returns ``{"output_tok_s", "total_output_tokens", "elapsed_s", "config", "transformers",
    "error", ...}``: the throughput of the strongest configuration that completed, counting only
    the requested generated tokens. ``error`` is None when continuous batching ran; it holds the
    reason when the run fell back to ``generate-padded``, timed out, or nothing worked at all.
    Extra keys: ``attempts`` (every configuration tried, with its error), ``length_check``,
    ``finished_requests``, ``requested_output_tokens``, ``details`` (resolved settings) and
    ``workload`` (its summary).

    ``timeout_s`` bounds the whole call (loading and warm-up included); when the timed part runs
    out of time, the tokens of the requests finished so far are reported with an error.
    """
    import transformers

    start_all = time.perf_counter()
    deadline = None if timeout_s is None else start_all + float(timeout_s)
    device = _normalize_device(device)
    torch_dtype = _torch_dtype(dtype)
    requested = sum(int(o) for _, o, _ in workload)

    result: dict[str, Any] = {
        "output_tok_s": 0.0,
        "total_output_tokens": 0,
        "elapsed_s": 0.0,
        "config": None,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": _device_name(device),
        "error": None,
        "attempts": [],
        "requested_output_tokens": requested,
        "finished_requests": 0,
        "length_check": None,
        "details": {},
        "workload": workload_summary(workload),
    }
    if not workload:
        result["error"] = "empty workload"
        return result

    plan = _plan_attempts(device, compile_level, modes)
    logger.info("transformers %s on %s; plan: %s", transformers.__version__, device,
                ", ".join(a["name"] for a in plan))
    cb_errors: list[str] = []
    for attempt in plan:
        if deadline is not None and time.perf_counter() > deadline:
            result["error"] = _join_errors(cb_errors + [f"timeout ({timeout_s}s) before {attempt['name']}"])
            break
        logger.info("trying %s", attempt["name"])
        try:
            outcome = _run_attempt(
                attempt, model_path, workload, device, torch_dtype,
                max_batch_tokens=max_batch_tokens, num_blocks=num_blocks,
                warmup_requests=warmup_requests, padded_batch_size=padded_batch_size,
                deadline=deadline,
            )
        except PeerTimeout as exc:  # ran, but out of time: report what finished, do not fall back
            outcome = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], dict) else None
            message = f"{attempt['name']}: {exc.args[0]}"
            result["attempts"].append({"config": attempt["name"], "error": message})
            if outcome is not None:
                _fill_result(result, attempt, outcome)
            else:
                result["config"] = attempt["name"]
            result["error"] = _join_errors(cb_errors + [message])
            break
        except Exception as exc:  # noqa: BLE001 - any failure moves on to the next configuration
            message = f"{attempt['name']}: {type(exc).__name__}: {exc}"
            logger.warning("%s failed, falling back: %s", attempt["name"], message)
            logger.debug("%s", traceback.format_exc())
            result["attempts"].append({"config": attempt["name"], "error": message})
            if attempt["mode"] != "generate-padded":
                cb_errors.append(message)
            continue
        finally:
            _free_memory(device)
        result["attempts"].append({"config": attempt["name"], "error": None})
        _fill_result(result, attempt, outcome)
        if attempt["mode"] == "generate-padded":
            result["error"] = "continuous batching did not run: " + (
                _join_errors(cb_errors) if cb_errors else f"not attempted (modes={list(modes)})")
        elif outcome.get("error"):
            result["error"] = outcome["error"]
        break
    else:
        result["error"] = "no configuration ran: " + _join_errors(
            [a["error"] for a in result["attempts"] if a["error"]]
        )
    result["details"]["total_wall_s"] = round(time.perf_counter() - start_all, 3)
    return result


def run_hf_peer_subprocess(
    model_path: str,
    workload_name: str,
    num_requests: int | None = None,
    scale: int = 1,
    device: str = "cuda",
    max_batch_tokens: int | None = None,
    timeout_s: float | None = None,
    extra_args: list[str] | None = None,
) -> dict:
    """``run_hf_peer`` in a fresh Python process (clean GPU memory, no shared CUDA state)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--model", str(model_path),
               "--workload", workload_name, "--device", device, "--scale", str(scale),
               "--json", str(out)]
        if num_requests is not None:
            cmd += ["--num-requests", str(num_requests)]
        if max_batch_tokens is not None:
            cmd += ["--max-batch-tokens", str(max_batch_tokens)]
        if timeout_s is not None:
            cmd += ["--timeout", str(timeout_s)]
        cmd += list(extra_args or [])
        wall_limit = None if timeout_s is None else float(timeout_s) + 120.0
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=wall_limit)
        except subprocess.TimeoutExpired:
            return _failed_result(f"peer subprocess exceeded {wall_limit}s")
        if out.is_file():
            return json.loads(out.read_text())
        tail = (proc.stderr or proc.stdout or "")[-2000:]
        return _failed_result(f"peer subprocess exited with {proc.returncode} and no JSON: {tail}")


# --------------------------------------------------------------------------------------------- #
# Plan
# --------------------------------------------------------------------------------------------- #


def _plan_attempts(device: str, compile_level: int, modes: tuple[str, ...]) -> list[dict]:
    """The ordered list of configurations to try."""
    on_cuda = device.startswith("cuda") and torch.cuda.is_available()
    cb_attns: list[str] = []
    if on_cuda and importlib.util.find_spec("flash_attn_interface") is not None:
        cb_attns.append("flash_attention_3")
    if on_cuda and importlib.util.find_spec("flash_attn") is not None:
        cb_attns.append("flash_attention_2")
    cb_attns += ["sdpa", "paged|sdpa", "paged|eager"]

    plan: list[dict] = []
    if "cb-manager" in modes:
        levels = [compile_level, 0] if compile_level > 0 else [0]
        for level in levels:
            for attn in cb_attns:
                name = f"cb-manager/{attn}" + (f"/compile{level}" if level else "")
                plan.append({"name": name, "mode": "cb-manager", "attn": attn, "compile_level": level})
    if "cb-generate_batch" in modes:
        for attn in [a for a in cb_attns if a != "paged|sdpa"]:
            plan.append({"name": f"cb-generate_batch/{attn}", "mode": "cb-generate_batch",
                         "attn": attn, "compile_level": 0})
    if "generate-padded" in modes:
        for attn in ("sdpa", "eager"):
            plan.append({"name": f"generate-padded/{attn}", "mode": "generate-padded",
                         "attn": attn, "compile_level": 0})
    return plan


def _run_attempt(attempt: dict, model_path: str, workload: list, device: str,
                 torch_dtype: torch.dtype, **kw: Any) -> dict:
    t0 = time.perf_counter()
    model = _load_model(model_path, attempt["attn"], device, torch_dtype)
    load_s = time.perf_counter() - t0
    try:
        if attempt["mode"] == "cb-manager":
            outcome = _run_cb_manager(model, workload, device, attempt, **kw)
        elif attempt["mode"] == "cb-generate_batch":
            outcome = _run_cb_generate_batch(model, workload, device, attempt, **kw)
        else:
            outcome = _run_generate_padded(model, workload, device, attempt, **kw)
    except PeerTimeout as exc:
        if len(exc.args) > 1 and isinstance(exc.args[1], dict):
            exc.args[1].setdefault("details", {})["load_s"] = round(load_s, 3)
        raise
    finally:
        destroy = getattr(model, "destroy_cached_continuous_batching_manager", None)
        if callable(destroy):
            try:
                destroy()
            except Exception:  # noqa: BLE001
                pass
        del model
    outcome.setdefault("details", {})["load_s"] = round(load_s, 3)
    return outcome


def _fill_result(result: dict, attempt: dict, outcome: dict) -> None:
    tokens = int(outcome["output_tokens"])
    elapsed = float(outcome["elapsed_s"])
    suffix = outcome.get("config_suffix")
    result["config"] = attempt["name"] + (f" [{suffix}]" if suffix else "")
    result["total_output_tokens"] = tokens
    result["elapsed_s"] = round(elapsed, 4)
    result["output_tok_s"] = round(tokens / elapsed, 2) if elapsed > 0 else 0.0
    result["finished_requests"] = int(outcome.get("finished_requests", 0))
    result["length_check"] = outcome.get("length_check")
    details = dict(outcome.get("details", {}))
    details["attn_requested"] = attempt["attn"]
    details["compile_level"] = attempt["compile_level"]
    result["details"].update(details)


# --------------------------------------------------------------------------------------------- #
# Mode 1: the continuous-batching manager, one request at a time with its own length
# --------------------------------------------------------------------------------------------- #


@torch.no_grad()
def _run_cb_manager(model, workload: list, device: str, attempt: dict, *,
                    max_batch_tokens: int | None, num_blocks: int | None, warmup_requests: int,
                    deadline: float | None, **_: Any) -> dict:
    if not hasattr(model, "init_continuous_batching"):
        raise RuntimeError("this transformers has no init_continuous_batching")
    temperature = _uniform_temperature(workload)
    max_out = max(int(o) for _, o, _ in workload)
    gen_config = _cb_generation_config(max_out, temperature)
    cb_config, cb_notes = _cb_config(model, workload, device, max_batch_tokens, num_blocks,
                                     attempt["compile_level"])
    init_kwargs: dict[str, Any] = {"generation_config": gen_config}
    if cb_config is not None:
        init_kwargs["continuous_batching_config"] = cb_config
    hints = _workload_hints(workload)
    if hints is not None:
        init_kwargs["workload_hints"] = hints
    init_kwargs = _accepted_kwargs(model.init_continuous_batching, init_kwargs, "init_continuous_batching")

    _seed_everything(0)
    manager = model.init_continuous_batching(**init_kwargs)
    details: dict[str, Any] = {"api": "init_continuous_batching + add_request(max_new_tokens=per request)",
                               **cb_notes}
    started = False
    try:
        t0 = time.perf_counter()
        if hasattr(manager, "warmup") and not getattr(manager, "warmed_up", False):
            manager.warmup()  # CUDA-graph capture, cache creation
        manager.start()
        started = True
        add_kwargs = _add_request_kwargs(manager)

        # Warm-up on a few real prompts with short outputs (not timed).
        n_warm = min(max(0, warmup_requests), len(workload))
        if n_warm:
            warm = {f"warmup_{i}": (workload[i][0], min(int(workload[i][1]), _WARMUP_MAX_NEW_TOKENS))
                    for i in range(n_warm)}
            _submit(manager, warm, add_kwargs)
            got, _ = _collect(manager, set(warm), deadline, label="warm-up")
            bad = [rid for rid, r in got.items() if getattr(r, "error", None)]
            if bad:
                raise RuntimeError(f"warm-up requests failed: {got[bad[0]].error}")
        details["warmup_s"] = round(time.perf_counter() - t0, 3)
        details.update(_describe_manager(manager, model))

        # Timed run: the whole workload is submitted at once, as in generate_batch.
        requests = {f"req_{i}": (prompt, int(out)) for i, (prompt, out, _) in enumerate(workload)}
        _sync(device)
        t_start = time.perf_counter()
        _submit(manager, requests, add_kwargs)
        timed_out = False
        try:
            got, t_last = _collect(manager, set(requests), deadline, label="timed run")
        except PeerTimeout as exc:  # report finished requests over the whole time spent
            timed_out = True
            got, _ = exc.args[1]
            t_last = time.perf_counter()
        elapsed = max(t_last - t_start, 1e-9)
        outcome = _count_outputs(requests, got)
        outcome["elapsed_s"] = elapsed
        outcome["config_suffix"] = "per-request max_new_tokens"
        details["temperature"] = temperature
        details.update(_describe_manager(manager, model))
        outcome["details"] = details
        if timed_out:
            raise PeerTimeout(f"timeout: {len(got)}/{len(requests)} requests finished", outcome)
        _check_failures(outcome)
        return outcome
    finally:
        if started:
            _stop_manager(manager, hard=True)
        destroy = getattr(manager, "destroy", None)
        if callable(destroy):
            try:
                destroy()
            except Exception:  # noqa: BLE001
                pass


def _submit(manager, requests: dict[str, tuple[list[int], int]], add_kwargs: dict) -> None:
    for rid, (prompt, max_new) in requests.items():
        got = manager.add_request(input_ids=list(prompt), request_id=rid, max_new_tokens=int(max_new),
                                  **add_kwargs)
        if got is None and "request_id" in inspect.signature(manager.add_request).parameters:
            raise RuntimeError(f"manager refused request {rid}")


def _collect(manager, wanted: set[str], deadline: float | None, label: str):
    """Wait for every request in ``wanted`` to finish; returns ({id: output}, time of the last)."""
    got: dict[str, Any] = {}
    t_last = time.perf_counter()
    while len(got) < len(wanted):
        if deadline is not None and time.perf_counter() > deadline:
            raise PeerTimeout(f"{label} timed out with {len(got)}/{len(wanted)} finished", (got, t_last))
        out = manager.get_result(timeout=_POLL_S)
        if out is None:
            if not manager.is_running():
                status = getattr(manager, "background_thread_status", None)
                fatal = getattr(status, "fatal_error", None)
                raise RuntimeError(f"generation thread stopped during {label} "
                                   f"({len(got)}/{len(wanted)} finished): {fatal!r}")
            continue
        rid = getattr(out, "request_id", None)
        finished = out.is_finished() if hasattr(out, "is_finished") else True
        if rid in wanted and finished and rid not in got:
            got[rid] = out
            t_last = time.perf_counter()
    return got, t_last


def _stop_manager(manager, hard: bool) -> None:
    kwargs = {"block": True, "timeout": 30}
    params = inspect.signature(manager.stop).parameters
    if hard and "hard_stop" in params:
        kwargs["hard_stop"] = True
    try:
        manager.stop(**{k: v for k, v in kwargs.items() if k in params})
    except Exception as exc:  # noqa: BLE001
        logger.warning("manager.stop failed: %s", exc)


def _add_request_kwargs(manager) -> dict:
    params = inspect.signature(manager.add_request).parameters
    kwargs: dict[str, Any] = {}
    if "eos_token_id" in params:
        kwargs["eos_token_id"] = -1  # RequestState keeps only ids >= 0: EOS never stops a request
    if "streaming" in params:
        kwargs["streaming"] = False
    return kwargs


def _describe_manager(manager, model) -> dict:
    info: dict[str, Any] = {"attn_implementation": getattr(model.config, "_attn_implementation", None)}
    processors = getattr(getattr(manager, "logit_processor", None), "logits_processor", None)
    if processors is not None:
        info["logits_processors"] = [type(p).__name__ for p in processors]
    gen = getattr(manager, "generation_config", None)
    if gen is not None:
        info["do_sample"] = getattr(gen, "do_sample", None)
    cfg = getattr(manager, "continuous_batching_config", None)
    if cfg is not None and dataclasses.is_dataclass(cfg):
        for key in ("page_size", "block_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch",
                    "max_blocks_per_request", "use_cuda_graph", "use_async_batching", "scheduler_type",
                    "default_compile_level", "max_memory_percent", "allow_block_sharing"):
            if hasattr(cfg, key):
                info[f"cb.{key}"] = _jsonable(getattr(cfg, key))
    processor = getattr(manager, "batch_processor", None)
    cache = getattr(processor, "cache", None)
    for key in ("num_blocks", "max_batch_tokens", "block_size", "page_size"):
        if cache is not None and hasattr(cache, key):
            info[f"cache.{key}"] = _jsonable(getattr(cache, key))
    return info


# --------------------------------------------------------------------------------------------- #
# Mode 2: model.generate_batch, one max_new_tokens per call
# --------------------------------------------------------------------------------------------- #


@torch.no_grad()
def _run_cb_generate_batch(model, workload: list, device: str, attempt: dict, *,
                           max_batch_tokens: int | None, num_blocks: int | None, warmup_requests: int,
                           deadline: float | None, **_: Any) -> dict:
    if not hasattr(model, "generate_batch"):
        raise RuntimeError("this transformers has no generate_batch")
    temperature = _uniform_temperature(workload)
    buckets = _length_buckets(workload, _MAX_BUCKETS)
    cb_config, cb_notes = _cb_config(model, workload, device, max_batch_tokens, num_blocks, 0)

    def call(prompts: list[list[int]], max_new: int, warm: bool) -> dict:
        kwargs: dict[str, Any] = {"generation_config": _cb_generation_config(max_new, temperature),
                                  "progress_bar": False, "warmup": warm, "max_new_tokens": max_new}
        if cb_config is not None:
            kwargs["continuous_batching_config"] = cb_config
        kwargs = _accepted_kwargs(model.generate_batch, kwargs, "generate_batch")
        return model.generate_batch([list(p) for p in prompts], **kwargs)

    _seed_everything(0)
    t0 = time.perf_counter()
    n_warm = min(max(1, warmup_requests), len(workload))
    call([workload[i][0] for i in range(n_warm)], min(_WARMUP_MAX_NEW_TOKENS, buckets[0][1]), True)
    warmup_s = time.perf_counter() - t0

    _sync(device)
    t_start = time.perf_counter()
    requested: dict[str, tuple[list[int], int]] = {}
    got: dict[str, Any] = {}
    timed_out = False
    for b, (indices, bucket_max) in enumerate(buckets):
        if deadline is not None and time.perf_counter() > deadline:
            timed_out = True
            break
        outputs = call([workload[i][0] for i in indices], bucket_max, True)
        ordered = list(outputs.values())
        if len(ordered) != len(indices):
            raise RuntimeError(f"generate_batch returned {len(ordered)} results for {len(indices)} requests")
        for i, out in zip(indices, ordered):
            requested[f"req_{i}"] = (workload[i][0], int(workload[i][1]))
            got[f"req_{i}"] = out
    _sync(device)
    elapsed = max(time.perf_counter() - t_start, 1e-9)
    outcome = _count_outputs(requested, got, overshoot_ok=True)
    outcome["elapsed_s"] = elapsed
    outcome["config_suffix"] = f"{len(buckets)} length bucket(s), shared max_new_tokens each"
    outcome["details"] = {
        "api": "generate_batch (one max_new_tokens per call)",
        "buckets": [[len(ix), mx] for ix, mx in buckets],
        "note": "requests sorted by output length into buckets, each run with the bucket's largest "
                "length; only requested tokens counted",
        "warmup_s": round(warmup_s, 3),
        "temperature": temperature,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        **cb_notes,
    }
    if timed_out:
        raise PeerTimeout(f"timeout after {len(got)}/{len(workload)} requests", outcome)
    _check_failures(outcome)
    return outcome


def _length_buckets(workload: list, max_buckets: int) -> list[tuple[list[int], int]]:
    """Indices sorted by output length, cut into at most ``max_buckets`` equal-count groups."""
    order = sorted(range(len(workload)), key=lambda i: int(workload[i][1]))
    lengths = {int(workload[i][1]) for i in order}
    n_buckets = max(1, min(max_buckets, len(lengths), len(order)))
    size = math.ceil(len(order) / n_buckets)
    buckets = []
    for start in range(0, len(order), size):
        chunk = order[start:start + size]
        buckets.append((chunk, max(int(workload[i][1]) for i in chunk)))
    return buckets


# --------------------------------------------------------------------------------------------- #
# Mode 3: plain padded model.generate (no continuous batching)
# --------------------------------------------------------------------------------------------- #


@torch.no_grad()
def _run_generate_padded(model, workload: list, device: str, attempt: dict, *,
                         padded_batch_size: int | None, warmup_requests: int, deadline: float | None,
                         **_: Any) -> dict:
    temperature = _uniform_temperature(workload)
    bs = padded_batch_size or (_DEFAULT_PADDED_BATCH if device != "cpu" else 8)
    pad_id = 0
    order = sorted(range(len(workload)), key=lambda i: (int(workload[i][1]), len(workload[i][0])))
    batches = [order[s:s + bs] for s in range(0, len(order), bs)]

    def generate(indices: list[int], max_new: int) -> list[list[int]]:
        prompts = [list(workload[i][0]) for i in indices]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p):] = 1
        kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new, min_new_tokens=max_new, eos_token_id=None, pad_token_id=pad_id,
            do_sample=temperature > 0,
        )
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=None, top_p=None)
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
        return [row[width:].tolist() for row in out.cpu()]

    _seed_everything(0)
    t0 = time.perf_counter()
    warm = order[: max(1, min(warmup_requests, len(order)))]
    generate(warm, min(_WARMUP_MAX_NEW_TOKENS, max(int(workload[i][1]) for i in warm)))
    _sync(device)
    warmup_s = time.perf_counter() - t0

    t_start = time.perf_counter()
    requested: dict[str, tuple[list[int], int]] = {}
    got: dict[str, Any] = {}
    timed_out = False
    for indices in batches:
        if deadline is not None and time.perf_counter() > deadline:
            timed_out = True
            break
        max_new = max(int(workload[i][1]) for i in indices)
        for i, tokens in zip(indices, generate(indices, max_new)):
            requested[f"req_{i}"] = (workload[i][0], int(workload[i][1]))
            got[f"req_{i}"] = tokens
    _sync(device)
    elapsed = max(time.perf_counter() - t_start, 1e-9)
    outcome = _count_outputs(requested, got, overshoot_ok=True)
    outcome["elapsed_s"] = elapsed
    outcome["config_suffix"] = f"batch {bs}, no continuous batching"
    outcome["details"] = {
        "api": "model.generate, left-padded batches sorted by output length",
        "batch_size": bs,
        "note": "each batch runs to its longest request; only requested tokens counted",
        "warmup_s": round(warmup_s, 3),
        "temperature": temperature,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    if timed_out:
        raise PeerTimeout(f"timeout after {len(got)}/{len(workload)} requests", outcome)
    return outcome


# --------------------------------------------------------------------------------------------- #
# Counting
# --------------------------------------------------------------------------------------------- #


def _count_outputs(requested: dict[str, tuple[list[int], int]], got: dict[str, Any],
                   overshoot_ok: bool = False) -> dict:
    """Count generated tokens, at most the requested number per request, and check the lengths.

    ``overshoot_ok``: a request may legitimately generate more than asked (a shared
    ``max_new_tokens``); the surplus is reported as ``wasted_tokens`` rather than as a mismatch.
    """
    counted = wasted = failed = 0
    short: list[tuple[str, int, int]] = []
    long: list[tuple[str, int, int]] = []
    first_error = None
    for rid, out in got.items():
        want = requested[rid][1]
        if isinstance(out, list):
            tokens, error = out, None
        else:
            tokens, error = list(getattr(out, "generated_tokens", []) or []), getattr(out, "error", None)
        if error:
            failed += 1
            first_error = first_error or str(error)
        n = len(tokens)
        counted += min(n, want)
        if n < want:
            short.append((rid, n, want))
        elif n > want:
            if overshoot_ok:
                wasted += n - want
            else:
                long.append((rid, n, want))
    missing = len(requested) - len(got)
    if not short and not long and not missing:
        check = "ok: every request produced exactly its requested length"
        if wasted:
            check = f"ok: every request reached its length ({wasted} surplus tokens not counted)"
    else:
        parts = []
        if missing:
            parts.append(f"{missing} missing")
        if short:
            parts.append(f"{len(short)} short (e.g. {short[0][0]}: {short[0][1]}/{short[0][2]})")
        if long:
            parts.append(f"{len(long)} long (e.g. {long[0][0]}: {long[0][1]}/{long[0][2]})")
        check = "MISMATCH: " + ", ".join(parts)
    return {"output_tokens": counted, "finished_requests": len(got), "wasted_tokens": wasted,
            "failed": failed, "first_error": first_error, "length_check": check}


def _check_failures(outcome: dict) -> None:
    """Requests that errored inside transformers: all of them fails the attempt, some is reported."""
    if not outcome["failed"]:
        return
    message = f"{outcome['failed']} request(s) failed: {outcome['first_error']}"
    if outcome["output_tokens"] == 0 or outcome["failed"] == outcome["finished_requests"]:
        raise RuntimeError(message)
    outcome["error"] = message


# --------------------------------------------------------------------------------------------- #
# transformers plumbing (feature-detected)
# --------------------------------------------------------------------------------------------- #


def _load_model(model_path: str, attn: str, device: str, torch_dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    base = {"attn_implementation": attn}
    tries = [
        {**base, "dtype": torch_dtype, "device_map": device},
        {**base, "dtype": torch_dtype},
        {**base, "torch_dtype": torch_dtype},
    ]
    last: Exception | None = None
    for kwargs in tries:
        try:
            model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
        except TypeError as exc:  # an unknown keyword in this version
            last = exc
            continue
        except ValueError as exc:
            if "device_map" in kwargs and "accelerate" in str(exc).lower():
                last = exc
                continue
            raise
        model = model.to(device=device, dtype=torch_dtype).eval()
        return model
    raise RuntimeError(f"could not load {model_path}: {last}")


def _cb_generation_config(max_new_tokens: int, temperature: float):
    from transformers import GenerationConfig

    kwargs: dict[str, Any] = {"max_new_tokens": int(max_new_tokens), "eos_token_id": -1, "pad_token_id": 0}
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=False)
    config = GenerationConfig(**kwargs)
    config.eos_token_id = -1  # may be normalised away by validation: set it again
    return config


def _cb_config(model, workload: list, device: str, max_batch_tokens: int | None,
               num_blocks: int | None, compile_level: int):
    """A ``ContinuousBatchingConfig`` with the fields this version knows, or None without the class."""
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        try:
            from transformers import ContinuousBatchingConfig  # type: ignore[attr-defined]
        except ImportError:
            return None, {"cb_config": "class not available: library defaults"}
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)} \
        if dataclasses.is_dataclass(ContinuousBatchingConfig) \
        else set(inspect.signature(ContinuousBatchingConfig).parameters)
    page_field = "page_size" if "page_size" in fields else ("block_size" if "block_size" in fields else None)
    page = 256
    wanted: dict[str, Any] = {}
    if device == "cpu":
        # No reliable memory probe on CPU: size the cache for the whole workload, keep batches small.
        page = 16
        if num_blocks is None:
            num_blocks = sum(math.ceil((len(p) + int(o)) / page) + 1 for p, o, _ in workload) + 4
        if max_batch_tokens is None:
            max_batch_tokens = _CPU_DEFAULT_MAX_BATCH_TOKENS
        if page_field:
            wanted[page_field] = page
    if num_blocks is not None:
        wanted["num_blocks"] = int(num_blocks)
    if max_batch_tokens is not None:
        wanted["max_batch_tokens"] = int(max_batch_tokens)
    if compile_level:
        if "default_compile_level" not in fields:
            raise RuntimeError("compile requested but ContinuousBatchingConfig has no default_compile_level")
        wanted["default_compile_level"] = int(compile_level)
    wanted["seed"] = 0
    kwargs = {k: v for k, v in wanted.items() if k in fields}
    dropped = sorted(set(wanted) - set(kwargs))
    if dropped:
        logger.info("ContinuousBatchingConfig of this version lacks %s: left out", dropped)
    notes = {"cb_config_requested": _jsonable(kwargs)}
    return ContinuousBatchingConfig(**kwargs), notes


def _workload_hints(workload: list):
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        return None
    try:
        return WorkloadHints(
            max_prompt_length=max(len(p) for p, _, _ in workload),
            max_generated_length=max(int(o) for _, o, _ in workload),
            num_requests=len(workload),
        )
    except TypeError:
        return None


def _accepted_kwargs(fn, kwargs: dict, label: str) -> dict:
    """Keep the keyword arguments ``fn`` accepts (all of them if it takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    kept = {k: v for k, v in kwargs.items() if k in params}
    if len(kept) != len(kwargs):
        logger.info("%s does not take %s: left out", label, sorted(set(kwargs) - set(kept)))
    return kept


def _uniform_temperature(workload: list) -> float:
    temps = {float(t) for _, _, t in workload}
    if len(temps) != 1:
        raise ValueError(f"mixed temperatures {sorted(temps)} are not supported by the peer run")
    return temps.pop()


# --------------------------------------------------------------------------------------------- #
# Small helpers
# --------------------------------------------------------------------------------------------- #


def _normalize_device(device: str) -> str:
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("CUDA requested but not available: using CPU")
        return "cpu"
    return device


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def _torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
             "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}")
    return table[name]


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return str(value)


def _join_errors(errors: list[str]) -> str:
    return " | ".join(e for e in errors if e) or "unknown error"


def _failed_result(message: str) -> dict:
    try:
        import transformers

        version = transformers.__version__
    except Exception:  # noqa: BLE001
        version = None
    return {"output_tok_s": 0.0, "total_output_tokens": 0, "elapsed_s": 0.0, "config": None,
            "transformers": version, "error": message}


# --------------------------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------------------------- #


def _vocab_size(model_path: str) -> int:
    config = json.loads((Path(model_path) / "config.json").read_text())
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not vocab:
        raise ValueError(f"{model_path}/config.json has no vocab_size")
    return int(vocab)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (HF format)")
    parser.add_argument("--workload", required=True, choices=WORKLOADS, type=str.upper)
    parser.add_argument("--num-requests", type=int, default=None, help="scale the request count")
    parser.add_argument("--scale", type=int, default=1, help="divide prompt and output lengths (smoke tests)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-batch-tokens", type=int, default=None)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--compile-level", type=int, default=0,
                        help="ContinuousBatchingConfig.default_compile_level to try first (0: no torch.compile)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--warmup-requests", type=int, default=_DEFAULT_WARMUP_REQUESTS)
    parser.add_argument("--padded-batch-size", type=int, default=None,
                        help="batch size of the generate-padded fallback (default 64 on GPU, 8 on CPU)")
    parser.add_argument("--modes", default="cb-manager,cb-generate_batch,generate-padded",
                        help="comma-separated subset of cb-manager, cb-generate_batch, generate-padded")
    parser.add_argument("--json", dest="json_out", default=None, help="write the result here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    workload = make_workload(args.workload, _vocab_size(args.model), args.num_requests, scale=args.scale)
    result = run_hf_peer(
        args.model, workload, device=args.device, max_batch_tokens=args.max_batch_tokens,
        timeout_s=args.timeout, num_blocks=args.num_blocks, compile_level=args.compile_level,
        dtype=args.dtype, warmup_requests=args.warmup_requests, padded_batch_size=args.padded_batch_size,
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
    )
    result["workload_name"] = args.workload
    result["scale"] = args.scale
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(text + "\n")
    print(text)
    return 0 if result["config"] is not None and result["total_output_tokens"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
