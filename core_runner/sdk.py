"""Everything a plugin author may import, in one module.

A plugin is built from this module and ``core_runner.layers`` only: the hook marker,
the ModelState contract and the types its methods receive, the cache specs a state
declares, the staged / UVA-backed row tables a state may keep, and the forward context
its layers read, the ``DraftModel`` contract of a speculative-decoding draft, and
``register_backend`` with the ``AttentionBackend`` base for a plugin
that brings its own attention backend. Anything else in ``core_runner`` is internal.

``SDK_VERSION`` (also ``__version__``) versions this module and ``core_runner.layers``
together, semantically: a plugin declares the range it needs with
``registry.add(..., sdk_version=">=1.0,<2")``; docs/plugin_contract.md is the policy.
"""
from core_runner.attention.backend import AttentionBackend, AttnMetadata
from core_runner.attention.registry import register_backend
from core_runner.config import EngineConfig
from core_runner.draft_model import DraftModel
from core_runner.forward_context import get_forward_context, use_triton_kernels
from core_runner.kv_cache_spec import KVCacheSpec, PagedCacheSpec, RowStateSpec, collect_kv_cache_specs
from core_runner.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from core_runner.model_state import ModelState
from core_runner.plugins import hookimpl
from core_runner.pooling_params import POOLING_TYPES, PoolingParams
from core_runner.sampling_params import SamplingParams
from core_runner.sdk_version import SDK_VERSION
from core_runner.step_data.buffers import StagedWriteTensor, UvaBackedTensor
from core_runner.step_data.input_batch import InputBatch
from core_runner.step_data.scheduler_output import NewRequest

__version__ = SDK_VERSION
__all__ = [
    "SDK_VERSION", "AttentionBackend", "BatchUpdate", "LogitsProcessor", "MoveDirectionality", "AttnMetadata",
    "DraftModel", "EngineConfig", "InputBatch", "KVCacheSpec", "ModelState", "NewRequest", "POOLING_TYPES",
    "PagedCacheSpec", "PoolingParams", "RowStateSpec", "SamplingParams", "StagedWriteTensor", "UvaBackedTensor",
    "collect_kv_cache_specs", "get_forward_context", "hookimpl", "register_backend", "use_triton_kernels",
]
