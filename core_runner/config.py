"""EngineConfig: every engine option in one frozen dataclass, validated once."""
from __future__ import annotations

import functools
import logging
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from core_runner.speculative_config import SpeculativeConfig

_DTYPES = ("float32", "float16", "bfloat16", "auto")
_KERNELS = (None, "torch", "triton")
_GENERATION_CONFIGS = ("auto", "vllm")
_LOAD_FORMATS = ("auto", "safetensors", "dummy")
# vLLM's names: "fp8" is e4m3 (the format of checkpoint k_scale / v_scale); e5m2 needs no scale
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_GIB = 1 << 30
DEFAULT_BLOCK_SIZE = 16
# A GPU this large holds the batch the bench found best on an H200 (1,024 / 8,192 gave
# W1 79,420 tok/s, W2 23,306); smaller ones get vLLM's defaults for its smaller GPUs.
LARGE_GPU_BYTES = 70 * _GIB
GPU_MEMORY_UTILIZATION = 0.9
KV_CACHE_MEMORY_FRACTION = 0.5

logger = logging.getLogger(__name__)


def strict_from_env() -> bool:
    return os.environ.get("CORE_RUNNER_STRICT", "0").lower() in ("1", "true", "yes")


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"`` (with a logged note);
    any other value is returned unchanged."""
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    logger.warning("device='auto': no CUDA device visible, running on the CPU")
    return "cpu"


def device_total_memory(device: str) -> int | None:
    """Total bytes of a CUDA device, None for the CPU or when no GPU is visible (a config
    may name "cuda" on a machine without one: plans are computed there, engines are not)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def choose_batch_limits(
    device: str, total_memory: int | None, max_model_len: int,
    max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
) -> tuple[int, int]:
    """The (max_num_seqs, max_num_batched_tokens) an engine uses when the user left them None.

    CUDA with >= 70 GiB: 1,024 / 8,192; smaller or unknown GPUs: 256 / 2,048 (vLLM's
    defaults); CPU: 64 / 2,048. The token budget is raised to ``max_model_len`` so that a
    full-length prompt fits one step without chunked prefill, and never exceeds what
    ``max_num_seqs`` full-length requests could use. Values the user gave are kept.
    """
    if not device.startswith("cuda"):
        seqs, tokens = 64, 2048
    elif total_memory is not None and total_memory >= LARGE_GPU_BYTES:
        seqs, tokens = 1024, 8192
    else:
        seqs, tokens = 256, 2048
    seqs = seqs if max_num_seqs is None else max_num_seqs
    if max_num_batched_tokens is None:
        tokens = min(max(tokens, max_model_len), seqs * max_model_len)
    else:
        tokens = max_num_batched_tokens
    return seqs, tokens


# str fields that name a path or a hub id: an os.PathLike is taken as its str
PATH_FIELDS = ("model", "tokenizer")


@functools.cache
def _field_types() -> dict[str, tuple[type, ...] | None]:
    """EngineConfig's field -> the types its annotation allows (None: Any, unchecked)."""
    hints = typing.get_type_hints(EngineConfig)
    out: dict[str, tuple[type, ...] | None] = {}
    for f in fields(EngineConfig):
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        out[f.name] = None if any(a is Any for a in args) else tuple(args)
    return out


@dataclass(frozen=True)
class EngineConfig:
    """Options of one engine. Every field either changes behaviour or is rejected.

    Defaults follow vLLM and are resolved once, here, so that every field holds a concrete
    value after construction (except ``num_kv_blocks``, sized by the engine, and the
    memory field of the other device kind, which stays None):

    - ``device="auto"``: ``"cuda"`` when a GPU is visible, else ``"cpu"`` (logged).
    - ``max_num_seqs`` / ``max_num_batched_tokens`` None: chosen from the device by
      ``choose_batch_limits`` (1,024 / 8,192 on a GPU of >= 70 GiB, 256 / 2,048 on a
      smaller one, 64 / 2,048 on the CPU; the token budget at least ``max_model_len``) and
      logged. A ``max_num_batched_tokens`` below ``max_model_len`` needs a model whose
      plugin supports chunked prefill. The engine halves a chosen ``max_num_seqs`` for a
      model with per-row recurrent state (Mamba) until the rows, their prefix-cache
      snapshots and a full-length KV per row fit 0.8 of the cache memory
      (``engine/defaults.fit_max_num_seqs``, logged); the engine's ``config`` shows the
      result. A given value is kept.
    - ``gpu_memory_utilization`` (CUDA, default 0.9): the fraction of the device's total
      memory the engine may use for weights, activations (profiled with a dummy step of
      ``max_num_batched_tokens``) and the KV pool, which gets what is left. Given on the
      CPU it means the same of the host's memory (activations not profiled).
    - ``kv_cache_memory_fraction`` (CPU, default 0.5): the fraction of the host's available
      memory the KV pool may take. On CUDA it is refused: use gpu_memory_utilization.
    - ``dtype="auto"``: the checkpoint's dtype on the GPU, float32 on the CPU
      (``core_runner.engine.defaults.resolve_dtype``).
    - ``generation_config``: ``"auto"`` applies the checkpoint's generation_config.json
      sampling defaults (``LLM.get_default_sampling_params``); ``"vllm"`` ignores them.

    ``num_kv_blocks=None`` sizes the KV pool from memory. ``async_scheduling=None`` means
    on for CUDA, off for the CPU (where it is allowed, but has nothing to overlap).
    ``kernels`` picks the implementation of every layer other than attention (RMSNorm,
    rotary, SiluAndMul, fused MoE, Mamba), of input prep and of the sampler: None (auto)
    means ``"triton"`` on CUDA when triton is installed and ``"torch"`` (the references)
    on the CPU; ``"triton"`` on the CPU needs ``TRITON_INTERPRET=1`` (kernel tests).
    ``attention_backend`` picks only the attention backend, by its registered name
    (``core_runner.attention.registry``: "torch", "triton", ...); None means the one
    matching ``kernels``. CUDA graphs need kernels="triton" and a graph-capable backend.
    ``enable_prefix_caching``: None (the default) turns the prefix cache on for a family
    that declares prefix_caching supported, as vLLM does; True asks for it (a named
    downgrade, or an error in strict mode, for a family that does not support it); False
    turns it off.
    ``model`` (and ``tokenizer``) is a local checkpoint directory or a Hugging Face model id,
    fetched into the hub cache (only the cache with ``HF_HUB_OFFLINE=1``); ``revision`` (a
    branch, tag or commit) picks the id's version, ``tokenizer_revision`` the tokenizer's
    (default: ``revision`` when the tokenizer comes from the model). Both are errors for a
    local directory.
    ``tensor_parallel_size`` N > 1 splits the model over N ranks (one process each, the
    driver being rank 0; GPUs cuda:0..N-1 of each node, or the CPU with gloo), for
    families declaring ``tensor_parallel``; ``enable_expert_parallel`` then gives MoE layers
    whole experts per rank (``expert_parallel``). ``nnodes`` / ``node_rank`` /
    ``master_addr`` / ``master_port`` (vLLM's names) spread the ranks over nodes: this
    engine is node 0, the others run ``core-runner serve --headless``; ``master_port`` None
    picks a free port on one node and is required with several. ``pipeline_parallel_size``
    keeps vLLM's name; only 1 is implemented. ``speculative_config`` (vLLM's dict, parsed
    into a ``SpeculativeConfig``) turns on speculative decoding for families declaring
    ``speculative_decoding``. ``load_format`` "auto" / "safetensors" reads the checkpoint (the
    only format: pickles are refused); "dummy" gives random weights and reads only
    config.json (benchmarks of shapes without a checkpoint). ``max_cudagraph_capture_size``
    (vLLM's name; vLLM keeps it in its compilation config, which this engine does not have)
    is the largest batch, in tokens, replayed from a CUDA graph; None is 1024, and larger
    batches (prefill steps) run eagerly. ``kv_cache_dtype`` (vLLM's option): "auto" keeps K/V
    in the model's dtype; "fp8" (= "fp8_e4m3") and "fp8_e5m2" store them as 8-bit floats
    with a per-layer k/v scale (docs/fp8_kv_cache.md), for families declaring
    ``kv_cache_dtype:fp8``: the pool holds twice the tokens. ``trust_remote_code`` exists so that vLLM
    scripts passing False run unchanged; True is refused, since core-runner never runs
    a checkpoint's own Python code (a model family is a plugin).
    ``mamba_block_size`` (vLLM's name) and ``mamba_cache_slots``: prefix caching for a model
    with per-row recurrent state (``RowStateSpec``: Mamba layers) keeps that state every
    ``mamba_block_size`` tokens (a multiple of ``block_size``; None: 512 rounded up to one) in
    ``mamba_cache_slots`` snapshot slots (None: ``max_num_seqs``), so a hit resumes at such a
    boundary (docs/hybrid_prefix_caching.md). Both stay None here and are resolved by the
    engine, which refuses a value given to an engine that keeps no snapshots.
    """

    model: str
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int = 2048
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_fraction: float | None = None
    seed: int = 0
    strict: bool = field(default_factory=strict_from_env)
    enforce_eager: bool = False
    tokenizer: str | None = None
    max_logprobs: int = 20
    async_scheduling: bool | None = None
    attention_backend: str | None = None
    kernels: str | None = None
    enable_prefix_caching: bool | None = None
    revision: str | None = None
    tokenizer_revision: str | None = None
    generation_config: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    trust_remote_code: bool = False
    speculative_config: Any = None
    load_format: str = "auto"
    max_cudagraph_capture_size: int | None = None
    kv_cache_dtype: str = "auto"
    mamba_block_size: int | None = None
    mamba_cache_slots: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, value: object, valid: str) -> ValueError:
            return ValueError(f"{name}={value!r} is invalid: {valid}")

        self._check_types(bad)
        if self.dtype not in _DTYPES:
            raise bad("dtype", self.dtype, f"expected one of {_DTYPES}")
        if self.device not in ("cpu", "auto") and not re.fullmatch(r"cuda(:[0-9]+)?", self.device):
            raise bad("device", self.device, "expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
        object.__setattr__(self, "device", resolve_device(self.device))
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, name)
            if (v is not None or name in ("max_model_len", "block_size")) and (
                not isinstance(v, int) or isinstance(v, bool) or v < 1
            ):
                raise bad(name, v, "expected an integer >= 1" + ("" if name in ("max_model_len", "block_size")
                                                                 else " or None (chosen from the device)"))
        # A block holds the tokens of one request only, so the slots of a block past
        # max_model_len are never used; the default block stays valid for short lengths.
        # Any other size works: the kernels find a token's slot by // and %, not by shifts.
        block_limit = max(self.max_model_len, DEFAULT_BLOCK_SIZE)
        if self.block_size > block_limit:
            raise bad("block_size", self.block_size,
                      f"expected at most max(max_model_len={self.max_model_len}, {DEFAULT_BLOCK_SIZE}) = "
                      f"{block_limit}: a block holds one request's tokens, so a larger one allocates KV memory "
                      "that is never used")
        if self.max_num_seqs is None or self.max_num_batched_tokens is None:
            seqs, tokens = choose_batch_limits(self.device, device_total_memory(self.device), self.max_model_len,
                                               self.max_num_seqs, self.max_num_batched_tokens)
            logger.info("batch limits for %s: max_num_seqs=%d, max_num_batched_tokens=%d%s", self.device, seqs,
                        tokens, "" if self.max_num_seqs is None and self.max_num_batched_tokens is None
                        else " (one given, the other chosen)")
            # which limits were chosen here: the engine may lower a chosen max_num_seqs to fit a
            # model's per-row state (engine/defaults.fit_max_num_seqs), never a given one
            object.__setattr__(self, "_chosen_limits", (self.max_num_seqs is None, self.max_num_batched_tokens is None))
            object.__setattr__(self, "max_num_seqs", seqs)
            object.__setattr__(self, "max_num_batched_tokens", tokens)
        self._resolve_memory_fields(bad)
        if self.generation_config not in _GENERATION_CONFIGS:
            raise bad("generation_config", self.generation_config,
                      "expected 'auto' (the checkpoint's generation_config.json defaults) or 'vllm' (ignore them)")
        if self.num_kv_blocks is not None and (
            not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1
        ):
            raise bad("num_kv_blocks", self.num_kv_blocks, "expected None (size from memory) or an integer >= 1")
        if self.attention_backend is not None and (not isinstance(self.attention_backend, str)
                                                   or not self.attention_backend):
            # the name itself is checked by the oracle, against the registered backends
            raise bad("attention_backend", self.attention_backend, "expected None (auto) or a backend name")
        if self.kernels not in _KERNELS:
            raise bad("kernels", self.kernels, "expected None (auto), 'torch' or 'triton'")
        if self.enable_prefix_caching is not None and not isinstance(self.enable_prefix_caching, bool):
            raise bad("enable_prefix_caching", self.enable_prefix_caching,
                      "expected None (on where the family supports it), True or False")
        for name in ("revision", "tokenizer_revision"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise bad(name, v, "expected None (the default branch) or a branch, tag or commit name")
        self._check_parallel(bad)
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        if self.load_format not in _LOAD_FORMATS:
            raise bad("load_format", self.load_format, f"expected one of {_LOAD_FORMATS} ('dummy': random weights, "
                      "only config.json is read)")
        if self.trust_remote_code is not False:
            raise bad("trust_remote_code", self.trust_remote_code,
                      "expected False: core-runner never runs a checkpoint's own code; its architecture needs a "
                      "plugin (core-runner plugins lists them)")
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise bad("max_logprobs", self.max_logprobs, "expected an integer >= 0")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise bad("kv_cache_dtype", self.kv_cache_dtype, f"expected one of {KV_CACHE_DTYPES} (vLLM's names; "
                      "'fp8' is 'fp8_e4m3')")
        v = self.max_cudagraph_capture_size
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise bad("max_cudagraph_capture_size", v, "expected an integer >= 1 or None (1024)")
        for name in ("mamba_block_size", "mamba_cache_slots"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise bad(name, v, "expected an integer >= 1 or None (the default)")
        if self.mamba_block_size is not None and self.mamba_block_size % self.block_size:
            raise bad("mamba_block_size", self.mamba_block_size,
                      f"expected a multiple of block_size={self.block_size} (a state snapshot ends a KV block)")

    def _check_types(self, bad) -> None:
        """Every field against its annotation (``int | None``, ``bool``, ...): an int field takes
        no bool (bool is a subclass of int) and no float, a float field takes an int, a str
        field of a path (``PATH_FIELDS``) an ``os.PathLike`` (kept as its str)."""
        for name, allowed in _field_types().items():
            v = getattr(self, name)
            if allowed is None or (v is None and type(None) in allowed):
                continue
            if name in PATH_FIELDS and isinstance(v, os.PathLike):
                object.__setattr__(self, name, v := os.fspath(v))
            if isinstance(v, bool):
                ok = bool in allowed
            else:
                ok = any(isinstance(v, t) for t in allowed) or (float in allowed and isinstance(v, int))
            if not ok:
                names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
                raise bad(name, v, f"expected {names}, got {type(v).__name__}")

    def _check_parallel(self, bad) -> None:
        def positive(name: str) -> int:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(name, v, "expected an integer >= 1")
            return v

        tp, nodes = positive("tensor_parallel_size"), positive("nnodes")
        pp = self.pipeline_parallel_size
        if not isinstance(pp, int) or isinstance(pp, bool) or pp != 1:
            raise bad("pipeline_parallel_size", pp, "only 1 is supported (no pipeline parallelism; use "
                      "tensor_parallel_size to spread a model over devices)")
        if not isinstance(self.enable_expert_parallel, bool):
            raise bad("enable_expert_parallel", self.enable_expert_parallel, "expected True or False")
        if self.enable_expert_parallel and tp == 1:
            raise bad("enable_expert_parallel", True, "it needs tensor_parallel_size > 1 (experts are spread "
                      "over the tensor-parallel ranks)")
        if tp % nodes:
            raise bad("nnodes", nodes, f"expected a divisor of tensor_parallel_size={tp} (each node holds "
                      "the same number of ranks)")
        if not isinstance(self.node_rank, int) or isinstance(self.node_rank, bool) or self.node_rank != 0:
            raise bad("node_rank", self.node_rank, "an engine runs on node 0; start the other nodes with "
                      "`core-runner serve --headless --node-rank N ...`")
        if not isinstance(self.master_addr, str) or not self.master_addr:
            raise bad("master_addr", self.master_addr, "expected a host name or IP address of node 0")
        port = self.master_port
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise bad("master_port", port, "expected None (a free port, one node only) or a port in 1..65535")
        if nodes > 1 and port is None:
            raise bad("master_port", None, f"nnodes={nodes} needs a fixed port that the other nodes can reach")
        if tp > 1 and self.device.startswith("cuda:") and self.device != "cuda:0":
            raise bad("device", self.device, "with tensor_parallel_size > 1 each node's ranks use cuda:0..k-1; "
                      "pick the GPUs with CUDA_VISIBLE_DEVICES and pass device='cuda'")

    def _resolve_memory_fields(self, bad) -> None:
        util, frac = self.gpu_memory_utilization, self.kv_cache_memory_fraction
        for name, v, hi in (("gpu_memory_utilization", util, 1.0), ("kv_cache_memory_fraction", frac, 0.95)):
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.0 < v <= hi)
            if not ok:
                raise bad(name, v, f"expected None (the device's default) or a value in (0, {hi:g}]")
        if util is not None and frac is not None:
            raise bad("kv_cache_memory_fraction", frac,
                      f"give either it or gpu_memory_utilization={util}, not both (they size the same pool)")
        if self.device.startswith("cuda"):
            if frac is not None:
                raise bad("kv_cache_memory_fraction", frac,
                          "it sizes the KV pool from the CPU's host memory; on CUDA use gpu_memory_utilization "
                          "(the fraction of the GPU's total memory for weights + activations + KV, default 0.9)")
            object.__setattr__(self, "gpu_memory_utilization", GPU_MEMORY_UTILIZATION if util is None else util)
        elif util is None:
            object.__setattr__(self, "kv_cache_memory_fraction", KV_CACHE_MEMORY_FRACTION if frac is None else frac)

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def chunked_prefill_needed(self) -> bool:
        return self.max_num_batched_tokens < self.max_model_len
