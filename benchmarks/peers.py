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
import importlib.util
import json
import logging
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

from benchmarks.peer_routes import (  # noqa: E402
    _count_outputs,
    _length_buckets,
    _run_cb_generate_batch,
    _run_cb_manager,
    _run_generate_padded,
)
from benchmarks.peer_util import (  # noqa: E402
    _DEFAULT_WARMUP_REQUESTS,
    PeerTimeout,
    _device_name,
    _failed_result,
    _free_memory,
    _join_errors,
    _load_model,
    _normalize_device,
    _torch_dtype,
    _vocab_size,
)

__all__ = ["PeerTimeout", "run_hf_peer", "run_hf_peer_subprocess", "main", "_count_outputs", "_length_buckets"]


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
