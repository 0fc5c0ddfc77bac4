"""Building one rank's model runner: the same code on the driver and on every worker.

Everything a rank needs travels in a ``RankSpec`` (picklable: the registration holds
lazy "module:attr" strings, so a worker imports the plugin's classes by name, also a
plugin registered only in the driver's process, as long as its module is importable).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core_runner.attention.registry import get_backend
from core_runner.config import EngineConfig
from core_runner.executor.draft import DraftSpec, build_draft
from core_runner.kv_cache_dtype import report_kv_scales
from core_runner.kv_cache_spec import RowStateSpec
from core_runner.loader import build_model
from core_runner.oracle import ExecutionPlan, check_backend_takes_scales, check_model_fits
from core_runner.registry import Registration
from core_runner.runner.cuda_graphs import capture_sizes
from core_runner.runner.model_runner import ModelRunner


@dataclass
class RankSpec:
    config: EngineConfig
    registration: Registration
    plan: ExecutionPlan
    hf_config: Any
    model_path: str
    dtype: torch.dtype
    architecture: str
    draft: DraftSpec | None = None  # the speculative-decoding draft model, if any


def state_snapshot_slots(config, prefix_caching: bool, model_state) -> int:
    """Row-state snapshot slots (docs/hybrid_prefix_caching.md): mamba_cache_slots (None:
    max_num_seqs) when prefix caching is on and the model keeps row state, else 0."""
    if not prefix_caching or not any(isinstance(s, RowStateSpec) for s in model_state.kv_cache_specs()):
        return 0
    return config.mamba_cache_slots or config.max_num_seqs


def resolve_mamba_block_size(config) -> int:
    """mamba_block_size, or 512 rounded up to a multiple of block_size."""
    return config.mamba_block_size or -(-512 // config.block_size) * config.block_size


def build_runner(spec: RankSpec) -> ModelRunner:
    """Model (split for the current TP group), its ModelState and the runner, on the
    spec's ``config.device`` (a worker's spec names its own GPU)."""
    config = spec.config
    model_cls = spec.registration.load_model_class()
    model = build_model(model_cls, spec.hf_config, spec.dtype, config.device, spec.model_path,
                        load_format=config.load_format, seed=config.seed)
    report_kv_scales(model, config.kv_cache_dtype)
    state_cls = spec.registration.load_model_state_class()
    model_state = state_cls(config, model, torch.device(config.device))
    backend = get_backend(spec.plan.attention_backend)
    check_model_fits(backend, model, spec.architecture)  # e.g. MLA layers need supports_mla
    check_backend_takes_scales(backend, config.kv_cache_dtype)
    drafter = None
    if spec.draft is not None:
        drafter = build_draft(spec.draft, model, spec.hf_config, spec.dtype, config.device, config.load_format,
                              config.seed)
        check_model_fits(backend, drafter, spec.draft.registration.architecture)
    return ModelRunner(config, model, model_state, backend, triton_kernels=spec.plan.kernels == "triton",
                       cuda_graphs=spec.plan.cuda_graphs, drafter=drafter,
                       capture_sizes=capture_sizes(config.max_cudagraph_capture_size),
                       state_snapshot_slots=state_snapshot_slots(config, spec.plan.prefix_caching, model_state))
