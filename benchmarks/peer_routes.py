"""The three ways the peer can run a workload: transformers' continuous-batching manager,
``generate_batch`` in length groups, and padded ``generate`` as the last resort."""
from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import time
from typing import Any

# The GPU machine has no network: never let transformers / huggingface_hub try to reach the Hub
# (e.g. the `kernels` flash-attention fallback probe).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from benchmarks.peer_util import (
    _DEFAULT_PADDED_BATCH,
    _MAX_BUCKETS,
    _POLL_S,
    _WARMUP_MAX_NEW_TOKENS,
    PeerTimeout,
    _accepted_kwargs,
    _cb_config,
    _cb_generation_config,
    _jsonable,
    _seed_everything,
    _sync,
    _uniform_temperature,
    _workload_hints,
)

logger = logging.getLogger("benchmarks.peers")


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
    for _b, (indices, bucket_max) in enumerate(buckets):
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
