"""EngineConfig: every engine option in one frozen dataclass, validated once."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

_DTYPES = ("float32", "float16", "bfloat16", "auto")
_KERNELS = (None, "torch", "triton")


def strict_from_env() -> bool:
    return os.environ.get("CORE_RUNNER_STRICT", "0").lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class EngineConfig:
    """Options of one engine. Every field either changes behaviour or is rejected.

    ``max_num_batched_tokens`` is the token budget of one step; a value below
    ``max_model_len`` needs a model whose plugin supports chunked prefill.
    ``num_kv_blocks=None`` sizes the KV pool from free memory
    (``kv_cache_memory_fraction`` of it). ``async_scheduling=None`` means on for CUDA,
    off for the CPU (where it is allowed, but has nothing to overlap).
    ``kernels`` picks the implementation of every layer other than attention (RMSNorm,
    rotary, SiluAndMul, fused MoE, Mamba), of input prep and of the sampler: None (auto)
    means ``"triton"`` on CUDA when triton is installed and ``"torch"`` (the references)
    on the CPU; ``"triton"`` on the CPU needs ``TRITON_INTERPRET=1`` (kernel tests).
    ``attention_backend`` picks only the attention backend, by its registered name
    (``core_runner.attention.registry``: "torch", "triton", ...); None means the one
    matching ``kernels``. CUDA graphs need kernels="triton" and a graph-capable backend.
    ``enable_prefix_caching=True`` asks for a prefix cache: the oracle turns it off (with a
    named reason) for a family that declares prefix_caching unsupported, and rejects it
    otherwise, since the engine does not implement one yet.
    ``model`` (and ``tokenizer``) is a local checkpoint directory or a Hugging Face model id,
    fetched into the hub cache (only the cache with ``HF_HUB_OFFLINE=1``); ``revision`` (a
    branch, tag or commit) picks the id's version, ``tokenizer_revision`` the tokenizer's
    (default: ``revision`` when the tokenizer comes from the model). Both are errors for a
    local directory.
    """

    model: str
    dtype: str = "auto"
    device: str = "cpu"
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_fraction: float = 0.5
    seed: int = 0
    strict: bool = field(default_factory=strict_from_env)
    enforce_eager: bool = False
    tokenizer: str | None = None
    max_logprobs: int = 20
    async_scheduling: bool | None = None
    attention_backend: str | None = None
    kernels: str | None = None
    enable_prefix_caching: bool = False
    revision: str | None = None
    tokenizer_revision: str | None = None

    def __post_init__(self) -> None:
        def bad(name: str, value: object, valid: str) -> ValueError:
            return ValueError(f"{name}={value!r} is invalid: {valid}")

        if self.dtype not in _DTYPES:
            raise bad("dtype", self.dtype, f"expected one of {_DTYPES}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise bad("device", self.device, "expected 'cpu', 'cuda' or 'cuda:N'")
        for name in ("max_model_len", "max_num_seqs", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise bad(name, v, "expected an integer >= 1")
        if self.max_num_batched_tokens is None:
            default = min(max(self.max_model_len, 2048), self.max_num_seqs * self.max_model_len)
            object.__setattr__(self, "max_num_batched_tokens", default)
        mnbt = self.max_num_batched_tokens
        if not isinstance(mnbt, int) or mnbt < 1:
            raise bad("max_num_batched_tokens", mnbt, "expected an integer >= 1")
        if self.num_kv_blocks is not None and (
            not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1
        ):
            raise bad("num_kv_blocks", self.num_kv_blocks, "expected None (size from memory) or an integer >= 1")
        if not 0.0 < self.kv_cache_memory_fraction <= 0.95:
            raise bad("kv_cache_memory_fraction", self.kv_cache_memory_fraction, "expected a value in (0, 0.95]")
        if self.attention_backend is not None and (not isinstance(self.attention_backend, str)
                                                   or not self.attention_backend):
            # the name itself is checked by the oracle, against the registered backends
            raise bad("attention_backend", self.attention_backend, "expected None (auto) or a backend name")
        if self.kernels not in _KERNELS:
            raise bad("kernels", self.kernels, "expected None (auto), 'torch' or 'triton'")
        if not isinstance(self.enable_prefix_caching, bool):
            raise bad("enable_prefix_caching", self.enable_prefix_caching, "expected True or False")
        for name in ("revision", "tokenizer_revision"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise bad(name, v, "expected None (the default branch) or a branch, tag or commit name")
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise bad("max_logprobs", self.max_logprobs, "expected an integer >= 0")

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def chunked_prefill_needed(self) -> bool:
        return self.max_num_batched_tokens < self.max_model_len
