"""The capability oracle: picks the execution plan from config, platform and capabilities.

Each downgrade (something better exists on this platform but is blocked) is logged in
one line naming its blocker; in strict mode it is an error instead. An option that the
plan cannot honour is always an error.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field

from core_runner.config import EngineConfig
from core_runner.registry import Registration

logger = logging.getLogger(__name__)


class UnsupportedError(ValueError):
    """A requested option or a strict-mode downgrade that the plan cannot honour."""


@dataclass(frozen=True)
class ExecutionPlan:
    attention_backend: str
    sampler: str
    cuda_graphs: bool
    async_scheduling: bool
    chunked_prefill: bool
    downgrades: tuple[str, ...] = field(default=())


def plan_execution(config: EngineConfig, reg: Registration) -> ExecutionPlan:
    downgrades: list[str] = []

    def downgrade(what: str, reason: str) -> None:
        line = f"{what} off: {reason}"
        if config.strict:
            raise UnsupportedError(f"strict mode: {line} ({reg.architecture})")
        logger.warning(line)
        downgrades.append(line)

    if config.enable_prefix_caching:
        prefix = reg.capability("prefix_caching")
        if prefix.supported:
            raise UnsupportedError("prefix caching is not implemented by the engine yet")
        downgrade("prefix caching", f"{reg.architecture} declares prefix_caching {prefix.state}"
                  f"{': ' + prefix.reason if prefix.reason else ''}")

    chunk = reg.capability("chunked_prefill")
    if config.chunked_prefill_needed and not chunk.supported:
        raise UnsupportedError(
            f"max_num_batched_tokens={config.max_num_batched_tokens} < max_model_len={config.max_model_len} "
            f"needs chunked prefill, which {reg.architecture} declares {chunk.state}"
            f"{': ' + chunk.reason if chunk.reason else ''}; raise max_num_batched_tokens to >= max_model_len"
        )

    on_cuda = config.device.startswith("cuda")
    attention, sampler, graphs, async_sched = "torch", "torch", False, False
    if config.attention_backend == "triton" and not on_cuda:
        if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
            raise UnsupportedError("attention_backend='triton' on the CPU needs triton installed and "
                                   "TRITON_INTERPRET=1 (the interpreter); use None or 'torch'")
        attention = "triton"
    if on_cuda and config.attention_backend == "torch":
        logger.info("Triton attention off: attention_backend='torch' was asked for")
        if not config.enforce_eager:
            downgrade("CUDA graphs", "they need the Triton kernels, which are off")
    elif on_cuda:
        if not reg.capability("triton_attention").supported:
            downgrade("Triton attention", f"{reg.architecture} declares triton_attention "
                      f"{reg.capability('triton_attention').state}")
        elif importlib.util.find_spec("triton") is None:
            downgrade("Triton attention", "the triton package is not installed")
        elif _triton_backend_available():
            attention = "triton"
        else:
            downgrade("Triton attention", "core_runner.attention.triton_backend is not available in this build")
        if config.enforce_eager:
            logger.info("CUDA graphs off: enforce_eager=True")
        elif not reg.capability("cuda_graphs").supported:
            downgrade("CUDA graphs", f"{reg.architecture} declares cuda_graphs {reg.capability('cuda_graphs').state}")
        elif attention != "triton":
            downgrade("CUDA graphs", "they need the Triton kernels, which are off")
        else:
            graphs = True
    else:
        logger.info("device cpu: torch reference attention and sampler, eager")
    cap = reg.capability("async_scheduling")
    if config.async_scheduling is True and not cap.supported:
        raise UnsupportedError(f"async_scheduling=True but {reg.architecture} declares async_scheduling {cap.state}")
    if config.async_scheduling is None and on_cuda:
        if cap.supported:
            async_sched = True
        else:
            downgrade("async scheduling", f"{reg.architecture} declares async_scheduling {cap.state}")
    else:
        async_sched = bool(config.async_scheduling)
    sampler = attention  # the Triton sampler comes with the Triton kernels
    return ExecutionPlan(attention, sampler, graphs, async_sched, chunk.supported, tuple(downgrades))


def _triton_backend_available() -> bool:
    return importlib.util.find_spec("core_runner.attention.triton_backend") is not None
