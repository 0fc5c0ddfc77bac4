"""The interface between the loader and a quantization format, and the config parser."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

# quant_method -> what it needs; the message for an unknown method lists these
SUPPORTED = {
    "fp8": "block-scaled float8_e4m3fn weights with float32 '<weight>_scale_inv' tensors (DeepSeek-V3 format: "
           "fmt 'e4m3', activation_scheme 'dynamic', weight_block_size [b0, b1]; Qwen3-*-FP8 too)",
    "compressed-tensors": "format 'float-quantized': float8_e4m3fn weights with per-tensor or per-channel "
                          "'<weight>_scale' (strategy 'tensor' / 'channel'), activations dynamic per token or "
                          "static per tensor (parsed with the compressed-tensors library)",
}

# quant_method -> why a known format is refused (named in the message, with what would lift it)
REFUSED = {
    "mxfp4": "MXFP4 experts (OCP microscaling: 4-bit e2m1 values in blocks of 32 with e8m0 scales, gpt-oss's "
             "published format) need an MXFP4 MoE kernel, which core-runner does not have; dequantizing them to "
             "bf16 at load is possible later (about 4x the expert memory)",
}

Lookup = Callable[[str], "torch.Tensor | None"]
# [start, stop) along each dim of a checkpoint tensor: the part of it that one rank reads
Bounds = tuple[tuple[int, int], ...]


class RegionLookup(Protocol):
    """Reads any checkpoint tensor by name, or only a region of it."""

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of tensor ``name`` from its file's header (no data read); None if absent."""

    def read(self, name: str, bounds: Bounds) -> torch.Tensor:
        """Only the region ``bounds`` of tensor ``name``."""


class Quantization(ABC):
    """What the loader needs from a checkpoint quantization format.

    The loader skips tensors for which ``is_auxiliary`` holds. Every other tensor is either
    passed whole through ``prepare`` with a ``lookup(name) -> Tensor | None`` that reads any
    checkpoint tensor by name, whichever shard file holds it; or, read by region (a
    tensor-parallel rank reads only its rows or columns), checked with ``scale_for`` when
    it is opened and turned into weights with ``dequantize_region`` when its region is read.
    """

    method: str
    # the [b0, b1] grid of the scales a layer keeps beside resident fp8 weights (None: this
    # format is always dequantized at load); ``resident_scale`` fills it
    resident_block: tuple[int, int] | None = None

    def resident_scale(self, name: str, bounds: Bounds, scale_name: str, lookup: RegionLookup) -> torch.Tensor:
        """float32 scales on the ``resident_block`` grid for region ``bounds`` of fp8 weight
        ``name``: [..., ceil(rows / b0), ceil(cols / b1)] of the region. ValueError when the
        region cannot carry its own scales (a block-scaled region that does not start on a
        block boundary, or ends inside a block before the tensor's end)."""
        raise ValueError(f"quant_method {self.method!r} keeps no fp8 weights resident: weights are dequantized at "
                         "load")

    @abstractmethod
    def is_auxiliary(self, name: str) -> bool:
        """True for tensors consumed together with a weight (scales)."""

    @abstractmethod
    def scale_name(self, weight_name: str) -> str:
        """The checkpoint name of ``weight_name``'s scale tensor (present or not)."""

    @abstractmethod
    def prepare(self, name: str, tensor: torch.Tensor, lookup: Lookup, dtype: torch.dtype) -> torch.Tensor:
        """The tensor the parameter's weight_loader should see: a quantized weight
        dequantized into ``dtype``; an unquantized tensor unchanged."""

    @abstractmethod
    def scale_for(self, name: str, dtype: torch.dtype, shape: tuple[int, ...], lookup: RegionLookup) -> str | None:
        """The auxiliary tensor that checkpoint tensor ``name`` (stored as ``dtype``, of
        ``shape``) is dequantized with, or None to load it as it is. Reads headers only;
        ValueError when the two do not belong together (as ``prepare`` would raise)."""

    @abstractmethod
    def dequantize_region(self, name: str, tensor: torch.Tensor, bounds: Bounds, scale_name: str,
                          lookup: RegionLookup, dtype: torch.dtype) -> torch.Tensor:
        """``tensor``, the region ``bounds`` of quantized checkpoint tensor ``name``, in
        ``dtype``: only the part of ``scale_name`` that covers the region is read."""


class TensorLookup:
    """Reads a checkpoint tensor by name from whichever safetensors file holds it.

    The name -> file index is built on first use from the files' headers (no tensor
    data is read) and each file is opened once; loaders with a
    ``model.safetensors.index.json`` may pass their own callable instead.
    """

    def __init__(self, files: Iterable[str | Path]) -> None:
        self.files = [str(f) for f in files]
        self._index: dict[str, str] | None = None
        self._handles: dict[str, Any] = {}

    def _open(self, file: str) -> Any:
        from safetensors import safe_open

        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="pt")
        return self._handles[file]

    def _file_of(self, name: str) -> str | None:
        if self._index is None:
            self._index = {n: file for file in self.files for n in self._open(file).keys()}
        return self._index.get(name)

    def __call__(self, name: str) -> torch.Tensor | None:
        file = self._file_of(name)
        return None if file is None else self._open(file).get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...] | None:
        file = self._file_of(name)
        return None if file is None else tuple(self._open(file).get_slice(name).get_shape())

    def read(self, name: str, bounds: Bounds) -> torch.Tensor:
        file = self._file_of(name)
        if file is None:
            raise ValueError(f"checkpoint tensor {name!r} is in none of {self.files}")
        if not bounds:  # a 0-dim tensor has no region to slice
            return self._open(file).get_tensor(name)
        return self._open(file).get_slice(name)[tuple(slice(a, b) for a, b in bounds)]


def _as_dict(qc: Any) -> dict:
    if isinstance(qc, dict):
        return qc
    if hasattr(qc, "to_dict"):
        return qc.to_dict()
    raise ValueError(f"quantization_config={qc!r} is not a mapping: expected the config.json object")


def quantization_from_config(hf_config: Any) -> Quantization | None:
    """The checkpoint's quantization, or None when config.json has no quantization_config.

    Raises ValueError for a method or an fp8 variant that core-runner cannot load.
    """
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    qc = _as_dict(qc)
    method = qc.get("quant_method")
    if method == "fp8":
        from core_runner.quantization.fp8 import Fp8BlockQuantization

        return Fp8BlockQuantization.from_config(qc)
    if method == "compressed-tensors":
        from core_runner.quantization.compressed_tensors import CompressedTensorsFp8

        return CompressedTensorsFp8.from_config(qc)
    supported = "; ".join(f"{k!r}: {v}" for k, v in SUPPORTED.items())
    if method in REFUSED:
        raise ValueError(f"quantization_config.quant_method={method!r} is not supported by core-runner: "
                         f"{REFUSED[method]}. Supported: {supported}. Use a bf16/fp16/fp32 checkpoint of the model")
    raise ValueError(
        f"quantization_config.quant_method={method!r} is not supported by core-runner; supported: {supported}. "
        "Use an unquantized (bf16/fp16/fp32) checkpoint or one in a supported format"
    )
