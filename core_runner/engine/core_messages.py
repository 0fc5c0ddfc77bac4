"""The messages between an API process and an engine-core process (docs/engine_core_process.md).

msgspec structs encoded as msgpack arrays (``array_like``: no field names on the wire):
typed (a malformed message fails on decode with the path of the bad value), fast for a
step's batch of a few hundred outputs, and no code runs on decode (unlike pickle).
SamplingParams and PoolingParams travel as themselves (msgspec encodes dataclasses field
by field, so a field added to them travels with no change here). A tensor (a pooled
vector) travels as its raw bytes with dtype and shape, never pickled.

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
        request_id: str
        prompt_token_ids: list[int]
        sampling_params: SamplingParams | None
        pooling_params: PoolingParams | None
        arrival_time: float

    class EngineCoreAbort(msgspec.Struct, array_like=True, tag="abort"):
        request_ids: list[str]

    class EngineCoreOutput(msgspec.Struct, array_like=True):
        """What one step added to one request (new tokens only) and, when it finished, how."""

        request_id: str
        new_token_ids: list[int]
        new_logprobs: list[dict[int, float]] | None = None
        finish_reason: str | None = None
        stop_reason: int | str | None = None
        cumulative_logprob: float | None = None
        pooled: WireTensor | None = None

        @property
        def finished(self) -> bool:
            return self.finish_reason is not None

    class EngineCoreOutputs(msgspec.Struct, array_like=True, tag="outputs"):
        """One message per engine step: every request's delta, and the step's counters for /metrics."""

        outputs: list[EngineCoreOutput]
        num_running: int = 0
        num_waiting: int = 0
        kv_cache_usage: float = 0.0

    ToCore = EngineCoreRequest | EngineCoreAbort
    FromCore = EngineCoreOutputs

    _encoder = msgspec.msgpack.Encoder()
    _to_core = msgspec.msgpack.Decoder(ToCore)
    _from_core = msgspec.msgpack.Decoder(FromCore)

    def encode(message: Any) -> bytes:
        return _encoder.encode(message)

    def decode_to_core(raw: bytes) -> Any:
        return _to_core.decode(raw)

    def decode_from_core(raw: bytes) -> EngineCoreOutputs:
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
