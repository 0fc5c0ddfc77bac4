"""The messages between an API process and an engine-core process (docs/engine_core_process.md).

msgspec structs encoded as msgpack arrays (``array_like``: no field names on the wire):
typed (a malformed message fails on decode with the path of the bad value), fast for a
step's batch of a few hundred outputs, and no code runs on decode (unlike pickle).
SamplingParams and PoolingParams travel as themselves (msgspec encodes dataclasses field
by field, so a field added to them travels with no change here, and decoding runs their
``__post_init__`` checks again). ``AtMost`` (an int subclass) travels as a plain int: the
API process has already cut ``max_tokens`` to the context. A tensor (a pooled vector)
travels as its raw bytes with dtype and shape, never pickled.

msgspec is imported here at module level: only the process split imports this module, and
it refuses by name when msgspec is missing (``require_msgspec``).
"""
from __future__ import annotations

from typing import Any

try:
    import msgspec
except ImportError:  # pragma: no cover - the GPU image: the split is refused by name
    msgspec = None


def require_msgspec() -> None:
    if msgspec is None:
        raise RuntimeError("install msgspec and pyzmq to run the engine core in its own process, or set "
                           "CORE_RUNNER_ENABLE_MULTIPROCESSING=0 to keep it in the server's process")


if msgspec is not None:
    from core_runner.pooling_params import PoolingParams
    from core_runner.sampling_params import SamplingParams

    class WireTensor(msgspec.Struct, array_like=True):
        """A CPU tensor as its bytes: ``dtype`` is torch's name ("float32")."""

        dtype: str
        shape: list[int]
        data: bytes

    class EngineCoreRequest(msgspec.Struct, array_like=True, tag="add"):
        """A request the API process validated. ``seed`` is the one its InputProcessor drew
        (None: the core draws it); stop strings are not sent (the API process matches them)."""

        request_id: str
        prompt_token_ids: list[int]
        sampling_params: SamplingParams | None
        pooling_params: PoolingParams | None
        arrival_time: float
        seed: int | None = None

    class EngineCoreAbort(msgspec.Struct, array_like=True, tag="abort"):
        request_ids: list[str]

    class EngineCoreShutdown(msgspec.Struct, array_like=True, tag="shutdown"):
        """Finish: abort what runs, close the sockets, exit."""

    class EngineCoreReady(msgspec.Struct, array_like=True, tag="ready"):
        """What the API process needs to tokenize, validate and answer without the weights:
        the facts an ``InputProcessor`` is built from, the tokenizer's directory, the
        resolved config values the handlers read, the checkpoint's config.json (as JSON,
        for labels and such) and its sampling defaults (generation_config.json)."""

        model: str
        model_path: str
        tokenizer_path: str | None
        architecture: str
        tasks: list[str]
        max_model_len: int
        max_logprobs: int
        seed: int
        vocab_size: int | None
        eos_token_ids: list[int]
        max_positions: int | None
        chunked_prefill: bool
        hf_config_json: str
        sampling_defaults: dict[str, Any]
        pid: int

    class EngineCoreFailed(msgspec.Struct, array_like=True, tag="failed"):
        """The core could not start (``phase`` "startup") or its loop died ("fatal"): the
        original exception's module, type name and message, and its traceback as text."""

        phase: str
        exc_module: str
        exc_type: str
        message: str
        traceback: str = ""

    class EngineCoreOutput(msgspec.Struct, array_like=True):
        """What one step added to one request (new tokens only) and, when it finished, how."""

        request_id: str
        new_token_ids: list[int]
        new_logprobs: list[dict[int, float]] | None = None
        finish_reason: str | None = None
        stop_reason: int | str | None = None
        cumulative_logprob: float | None = None
        pooled: WireTensor | None = None
        # the core refused the request when adding it (a ValueError's message: e.g. its
        # PoolingParams against the model's pooling); finish_reason is then "error"
        refused: str | None = None

        @property
        def finished(self) -> bool:
            return self.finish_reason is not None

    class EngineCoreOutputs(msgspec.Struct, array_like=True, tag="outputs"):
        """One message per engine step: every request's delta, and the step's counters for
        /metrics (the prefix-cache and speculation counters as their growth since the last message)."""

        outputs: list[EngineCoreOutput]
        num_running: int = 0
        num_waiting: int = 0
        kv_cache_usage: float = 0.0
        prefix_cache_queries: int = 0
        prefix_cache_hits: int = 0
        spec_drafts: int = 0
        spec_draft_tokens: int = 0
        spec_accepted_tokens: int = 0

    ToCore = EngineCoreRequest | EngineCoreAbort | EngineCoreShutdown
    FromCore = EngineCoreOutputs | EngineCoreReady | EngineCoreFailed

    def _enc_hook(obj: Any) -> Any:
        if isinstance(obj, int):  # AtMost and other int subclasses: their value
            return int(obj)
        raise NotImplementedError(f"cannot send a {type(obj).__name__} to or from the engine core")

    _encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
    _to_core = msgspec.msgpack.Decoder(ToCore)
    _from_core = msgspec.msgpack.Decoder(FromCore)

    def encode(message: Any) -> bytes:
        return _encoder.encode(message)

    def decode_to_core(raw: bytes) -> Any:
        return _to_core.decode(raw)

    def decode_from_core(raw: bytes) -> Any:
        return _from_core.decode(raw)


def tensor_to_wire(t: Any) -> WireTensor:
    """A tensor's bytes (moved to the CPU, made contiguous) with its dtype and shape."""
    import torch

    t = t.detach().to("cpu").contiguous()
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return WireTensor(str(t.dtype).removeprefix("torch."), list(t.shape), raw)


def tensor_from_wire(w: WireTensor) -> Any:
    import torch

    dtype = getattr(torch, w.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"a tensor on the wire has dtype {w.dtype!r}, which is not a torch dtype")
    if not w.data:
        return torch.empty(w.shape, dtype=dtype)
    return torch.frombuffer(bytearray(w.data), dtype=dtype).reshape(w.shape)
