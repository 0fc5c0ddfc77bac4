"""The capability oracle: picks the execution plan from config, platform and capabilities.

The plan names two independent choices: ``kernels`` ("triton" or "torch": every layer
other than attention, input prep and the sampler) and ``attention_backend`` (a name in
``core_runner.attention.registry``, whose class declares its capabilities). CUDA graphs
need both kernels="triton" and a backend with ``supports_cuda_graphs``.

Each downgrade (something better exists on this platform but is blocked) is logged in
one line naming its blocker; in strict mode it is an error instead. An option that the
plan cannot honour is always an error.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core_runner.attention.registry import backend_class, backend_names, backends_with
from core_runner.config import EngineConfig
from core_runner.kv_cache_dtype import CAPABILITY as KV_FP8
from core_runner.quantization import quantization_from_config
from core_runner.quantization.base import SUPPORTED
from core_runner.registry import Registration

logger = logging.getLogger(__name__)


class UnsupportedError(ValueError):
    """A requested option or a strict-mode downgrade that the plan cannot honour."""


@dataclass(frozen=True)
class ExecutionPlan:
    attention_backend: str  # a registered attention backend name
    kernels: str  # "triton" or "torch": every other layer, input prep and the sampler
    cuda_graphs: bool
    async_scheduling: bool
    chunked_prefill: bool
    downgrades: tuple[str, ...] = field(default=())
    prefix_caching: bool = False
    num_speculative_tokens: int = 0  # k > 0: decoding requests verify k proposed tokens per step


def check_quantization(hf_config: Any, reg: Registration) -> None:
    """Refuse a quantized checkpoint whose family does not declare ``quantization:<method>``
    (its layers may not load the format's tensors). Unknown formats are refused by the parser."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return
    method = (qc if isinstance(qc, dict) else getattr(qc, "to_dict", lambda: {})()).get("quant_method")
    # the capability first: a family that does not declare the method refuses it even where
    # the method's parser (compressed-tensors) is not installed
    cap = reg.capability(f"quantization:{method}")
    if cap.supported:
        quantization_from_config(hf_config)  # the method's own refusals (variants, library missing)
        return
    if method not in SUPPORTED:
        quantization_from_config(hf_config)  # an unknown or refused method: the parser names it
    raise UnsupportedError(
        f"the checkpoint is quantized (quant_method={method!r}) but {reg.architecture} declares "
        f"quantization:{method} {cap.state}{': ' + cap.reason if cap.reason else ''}; use an "
        "unquantized checkpoint"
    )


_MISSING = object()


def config_value(hf_config: Any, dotted: str) -> Any:
    """The value of a dotted field (``rope_parameters.rope_type``) of a config; _MISSING if absent."""
    value: Any = hf_config
    for part in dotted.split("."):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        else:
            value = getattr(value, part, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def check_config(hf_config: Any, reg: Registration) -> None:
    """Refuse a config that moves a field the family declares it does not implement past the
    values it accepts (``accepted_config``): running it would silently compute something else."""
    for dotted, accepted in reg.accepted_config.items():
        value = config_value(hf_config, dotted)
        if value is not _MISSING and value not in accepted:
            raise UnsupportedError(
                f"config field {dotted}={value!r} is not implemented by {reg.architecture} (plugin {reg.plugin!r}): "
                f"it accepts {dotted} in {list(accepted)}; use a checkpoint with one of those values or a plugin "
                "that implements it"
            )


def check_parallel(config: EngineConfig, reg: Registration) -> None:
    """Refuse tensor / expert parallelism for a family that does not declare it: its layers
    may not split themselves across ranks (whole weights on every rank would give wrong sums)."""
    for asked, cap_name, option in (
        (config.tensor_parallel_size > 1, "tensor_parallel", f"tensor_parallel_size={config.tensor_parallel_size}"),
        (config.enable_expert_parallel, "expert_parallel", "enable_expert_parallel=True"),
    ):
        cap = reg.capability(cap_name)
        if asked and not cap.supported:
            raise UnsupportedError(
                f"{option} needs the {cap_name} capability, which {reg.architecture} (plugin {reg.plugin!r}) "
                f"declares {cap.state}{': ' + cap.reason if cap.reason else ''}; use "
                f"{'tensor_parallel_size=1' if cap_name == 'tensor_parallel' else 'enable_expert_parallel=False'}"
            )


def check_kv_cache_dtype(config: EngineConfig, reg: Registration) -> None:
    """Refuse an fp8 ``kv_cache_dtype`` for a family that does not declare ``kv_cache_dtype:fp8``
    (its layers may keep K/V outside the paged caches the runner casts; an attention-free
    family declares it "not applicable" and is refused with that reason)."""
    if config.kv_cache_dtype == "auto":
        return
    cap = reg.capability(KV_FP8)
    if not cap.supported:
        raise UnsupportedError(
            f"kv_cache_dtype={config.kv_cache_dtype!r} needs the {KV_FP8} capability, which {reg.architecture} "
            f"(plugin {reg.plugin!r}) declares {cap.state}{': ' + cap.reason if cap.reason else ''}; use "
            "kv_cache_dtype='auto'"
        )


def plan_execution(config: EngineConfig, reg: Registration) -> ExecutionPlan:
    downgrades: list[str] = []

    def downgrade(what: str, reason: str) -> None:
        line = f"{what} off: {reason}"
        if config.strict:
            raise UnsupportedError(f"strict mode: {line} ({reg.architecture})")
        logger.warning(line)
        downgrades.append(line)

    check_parallel(config, reg)
    check_kv_cache_dtype(config, reg)
    # None (the default) means on for a family that supports it, as vLLM does
    prefix = reg.capability("prefix_caching")
    prefix_caching = config.enable_prefix_caching is not False and prefix.supported
    if config.enable_prefix_caching and not prefix.supported:
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
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    have_triton = importlib.util.find_spec("triton") is not None
    kernels = "torch"
    if config.kernels == "triton" and not on_cuda:
        if not interpret or not have_triton:
            raise UnsupportedError("kernels='triton' on the CPU needs triton installed and TRITON_INTERPRET=1 "
                                   "(the interpreter); use None or 'torch'")
        kernels = "triton"
    elif on_cuda and config.kernels == "torch":
        logger.info("Triton kernels off: kernels='torch' was asked for")
    elif on_cuda:
        if have_triton:
            kernels = "triton"
        else:
            downgrade("Triton kernels", "the triton package is not installed")
    attention = _attention_backend(config, reg, kernels, on_cuda, interpret, downgrade)
    graphs = False
    if not on_cuda:
        logger.info("device cpu: %s kernels, %s attention, eager", kernels, attention)
    elif config.enforce_eager:
        logger.info("CUDA graphs off: enforce_eager=True")
    elif not reg.capability("cuda_graphs").supported:
        downgrade("CUDA graphs", f"{reg.architecture} declares cuda_graphs {reg.capability('cuda_graphs').state}")
    elif kernels != "triton":
        downgrade("CUDA graphs", "they need the Triton kernels, which are off")
    elif not getattr(backend_class(attention), "supports_cuda_graphs", False):
        downgrade("CUDA graphs", f"attention backend {attention!r} declares supports_cuda_graphs=False")
    else:
        graphs = True
    async_sched = False
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
    spec = config.speculative_config
    if spec is not None:
        cap = reg.capability("speculative_decoding")
        if not cap.supported:
            raise UnsupportedError(
                f"speculative_config (method {spec.method!r}) needs the speculative_decoding capability, which "
                f"{reg.architecture} declares {cap.state}{': ' + cap.reason if cap.reason else ''}; leave "
                "speculative_config=None"
            )
    return ExecutionPlan(attention, kernels, graphs, async_sched, chunk.supported, tuple(downgrades),
                         prefix_caching=prefix_caching, num_speculative_tokens=spec.num_speculative_tokens
                         if spec is not None else 0)


def _attention_backend(config: EngineConfig, reg: Registration, kernels: str, on_cuda: bool, interpret: bool,
                       downgrade: Callable[[str, str], None]) -> str:
    """The registered backend to use: the one asked for, else the one matching the kernel
    mode; a backend the family or this build cannot run falls back to "torch" (a named
    downgrade), except one asked for on the CPU, which is an error."""
    name = config.attention_backend or ("triton" if kernels == "triton" else "torch")
    what = f"{name[:1].upper()}{name[1:]} attention"
    if name not in backend_names():
        raise UnsupportedError(f"attention_backend={name!r} is invalid: registered backends are "
                               f"{', '.join(map(repr, backend_names()))} (core_runner.attention.registry)")
    try:
        cls = backend_class(name)
    except ImportError as e:
        if config.attention_backend is not None and not on_cuda:
            raise UnsupportedError(f"attention_backend={name!r} cannot be used here: {e}") from e
        downgrade(what, f"its backend cannot be imported in this build ({e})")
        return "torch"
    if getattr(cls, "needs_triton", False) and not on_cuda and not interpret:
        raise UnsupportedError(f"attention_backend={name!r} on the CPU needs triton installed and TRITON_INTERPRET=1 "
                               "(the interpreter); use None or 'torch'")
    gate = getattr(cls, "capability", None)
    # "not applicable" (a model without attention layers): the backend is never called
    if gate is not None and not reg.capability(gate).supported and not reg.capability(gate).not_applicable:
        cap = reg.capability(gate)
        downgrade(what, f"{reg.architecture} declares {gate} {cap.state}"
                  f"{': ' + cap.reason if cap.reason else ''}")
        return "torch"
    if on_cuda and name != "triton":
        logger.info("Triton attention off: attention backend %r (%s)", name,
                    "asked for" if config.attention_backend else f"kernels={kernels!r}")
    return name


def check_backend_takes_scales(backend: object, name: str) -> None:
    """Refuse an fp8 ``kv_cache_dtype`` with an attention backend that does not declare
    ``supports_kv_scales`` (the layers pass it ``kv_scale`` with every fp8 cache), at
    construction rather than as a TypeError in the first step."""
    if name == "auto" or getattr(backend, "supports_kv_scales", False):
        return
    fits = backends_with("supports_kv_scales")
    raise UnsupportedError(
        f"kv_cache_dtype={name!r} needs an attention backend with supports_kv_scales=True (its write_kv / forward "
        f"take the layers' kv_scale), but attention backend {getattr(backend, 'name', type(backend).__name__)!r} "
        f"does not declare it; use attention_backend={' or '.join(map(repr, fits)) or 'one that does'} or "
        "kv_cache_dtype='auto'")


def check_model_fits(backend: Any, model: Any, architecture: str) -> None:
    """Refuse an attention backend that lacks a capability some layer of ``model`` (an
    nn.Module) needs: the layer class declares ``needs_attention_capability`` (MLAAttention:
    "supports_mla") and the backend (class or instance) must declare that attribute true.
    Called at engine construction, so the error names the layer, the backend and the
    backends that would do, instead of a forward failing later."""
    for layer, module in model.named_modules():
        need = getattr(type(module), "needs_attention_capability", None)
        if need is None or getattr(backend, need, False):
            continue
        name = getattr(backend, "name", type(backend).__name__)
        fits = backends_with(need)
        raise UnsupportedError(
            f"{architecture} has a {type(module).__name__} layer ({layer or 'the model'}) that needs an attention "
            f"backend with {need}=True, but attention backend {name!r} declares {need}={getattr(backend, need, False)}"
            f"; use attention_backend={' or '.join(map(repr, fits)) if fits else 'a backend that supports it'}"
        )
    have = frozenset(getattr(backend, "attention_features", frozenset()))
    for layer, module in model.named_modules():
        opts = getattr(module, "options", None)
        wants = opts.features() if callable(getattr(opts, "features", None)) else frozenset()
        missing = sorted(wants - have)
        if missing:
            name = getattr(backend, "name", type(backend).__name__)
            raise UnsupportedError(
                f"{architecture}: attention layer {layer} uses {', '.join(missing)}, which attention backend "
                f"{name!r} does not implement (its attention_features: {sorted(have) or 'none'})"
            )
