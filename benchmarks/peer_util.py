"""Helpers of the transformers peer: model loading, transformers config objects, device and JSON utilities."""
from __future__ import annotations

import dataclasses
import gc
import inspect
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

# The GPU machine has no network: never let transformers / huggingface_hub try to reach the Hub
# (e.g. the `kernels` flash-attention fallback probe).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

logger = logging.getLogger("benchmarks.peers")

_MAX_BUCKETS = 4  # generate_batch fallback: at most this many max_new_tokens groups
_DEFAULT_WARMUP_REQUESTS = 4
_WARMUP_MAX_NEW_TOKENS = 16
_DEFAULT_PADDED_BATCH = 64
_CPU_DEFAULT_MAX_BATCH_TOKENS = 256
_POLL_S = 0.5


class PeerTimeout(RuntimeError):
    """The timed run did not finish within ``timeout_s``."""



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
