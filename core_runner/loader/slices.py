"""A region of one checkpoint tensor, read only when asked: how a tensor-parallel rank
reads its rows or columns of a weight and nothing else.

``CheckpointSlice`` offers what a weight loader may use (``core_runner.layers``'
``copy_into`` and ``materialize`` rely on nothing more):

- ``shape`` (a ``torch.Size``, of the current view) and ``dtype`` (what ``load()`` returns);
- ``narrow(dim, start, length)``: a view of the view, along any dim; it reads nothing;
- ``is_quantized``, ``load_stored()`` and ``load_resident_scale()``: for a layer that keeps fp8
  weights resident, the region's fp8 values as stored and its scales on the format's
  ``resident_block`` grid (ValueError when the region does not align to the blocks);
- ``load()``: the region's values, read with safetensors' ``get_slice(name)[...]`` so that
  only that region leaves the file; an fp8 weight is dequantized with only the block
  scales that cover the region; then cast to the parameter's dtype and device and checked
  finite, with errors naming the file, the tensor and the region.

A slice is valid while ``load_weights`` runs (it reads through the open file).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core_runner.loader.checkpoint import open_slice, read_error, read_tensor
from core_runner.loader.files import CheckpointError
from core_runner.loader.finite import prepared, region_text, target_dtype, where
from core_runner.quantization.base import Bounds, Quantization, RegionLookup

# safetensors' header dtype names
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
    "U8": torch.uint8, "BOOL": torch.bool,
}


@dataclass(frozen=True, slots=True)
class _Source:
    """One checkpoint tensor as its header describes it, and the parameter it goes to."""

    handle: Any  # the open safetensors file
    raw: Any  # safetensors' lazy view of the tensor
    file: Path
    name: str
    shape: tuple[int, ...]
    stored: torch.dtype
    param_dtype: torch.dtype
    device: torch.device
    quantization: Quantization | None
    lookup: RegionLookup | None
    scale: str | None  # the tensor it is dequantized with; None: loaded as stored

    def read(self, bounds: Bounds) -> torch.Tensor:
        """Region ``bounds`` as stored; only that region is read."""
        if all(a == 0 and b == n for (a, b), n in zip(bounds, self.shape, strict=True)):
            return read_tensor(self.handle, self.file, self.name)
        from safetensors import SafetensorError

        try:
            return self.raw[tuple(slice(a, b) for a, b in bounds)]
        except (SafetensorError, OSError, RuntimeError) as e:
            raise read_error(self.handle, self.file, self.name, e) from e


class CheckpointSlice:
    """A view of a region of one checkpoint tensor; see the module docstring."""

    __slots__ = ("_src", "_bounds")

    def __init__(self, src: _Source, bounds: Bounds) -> None:
        self._src, self._bounds = src, bounds

    @property
    def shape(self) -> torch.Size:
        return torch.Size(b - a for a, b in self._bounds)

    @property
    def dtype(self) -> torch.dtype:
        src = self._src
        return target_dtype(src.param_dtype if src.scale is not None else src.stored, src.param_dtype)

    @property
    def bounds(self) -> Bounds:
        """[start, stop) along each dim of the checkpoint tensor."""
        return self._bounds

    @property
    def is_whole(self) -> bool:
        return self.shape == torch.Size(self._src.shape)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointSlice:
        """Elements ``start .. start + length`` along ``dim`` (negative ``dim`` / ``start``
        count from the end, as ``torch.Tensor.narrow``); nothing is read."""
        n = len(self._bounds)
        if not -n <= dim < n:
            raise ValueError(f"narrow(dim={dim}) is out of range for a {n}-dim checkpoint tensor of shape "
                             f"{tuple(self.shape)}: expected {-n} <= dim < {n}")
        dim %= n
        lo, hi = self._bounds[dim]
        size = hi - lo
        first = start + size if start < 0 else start
        if length < 0 or not 0 <= first <= size or first + length > size:
            raise ValueError(f"narrow(dim={dim}, start={start}, length={length}) does not fit shape "
                             f"{tuple(self.shape)}: expected -{size} <= start and start + length <= {size}")
        bounds = list(self._bounds)
        bounds[dim] = (lo + first, lo + first + length)
        return CheckpointSlice(self._src, tuple(bounds))

    def read(self) -> torch.Tensor:
        """The region's values as stored, or dequantized for a quantized weight; not yet
        cast to the parameter's dtype nor checked (``load`` does both)."""
        src = self._src
        tensor = src.read(self._bounds)
        if src.scale is None:
            return tensor
        try:
            return src.quantization.dequantize_region(src.name, tensor, self._bounds, src.scale, src.lookup,
                                                      src.param_dtype)
        except ValueError as e:
            raise CheckpointError(f"{where(src.file, src.name)}: {e}") from e

    @property
    def is_quantized(self) -> bool:
        """Whether the tensor is an fp8 weight with a scale (``load`` dequantizes it)."""
        return self._src.scale is not None

    def load_stored(self) -> torch.Tensor:
        """The region as stored (fp8 values of a quantized weight), on the parameter's device."""
        return self._src.read(self._bounds).to(self._src.device)

    def load_resident_scale(self) -> torch.Tensor:
        """float32 scales of the region on the quantization's ``resident_block`` grid, on the
        parameter's device; ValueError (naming the region) when it does not align."""
        src = self._src
        try:
            scale = src.quantization.resident_scale(src.name, self._bounds, src.scale, src.lookup)
        except ValueError as e:
            raise ValueError(f"{where(src.file, src.name)}{region_text(self._bounds)}: {e}") from e
        return scale.to(src.device)

    def load(self) -> torch.Tensor:
        """The region as the parameter holds it: dtype, device, checked finite."""
        src = self._src
        partial = None if self.is_whole else self._bounds
        return prepared(self.read(), src.param_dtype, src.device, src.file, src.name, partial, src.shape)

    def __repr__(self) -> str:
        return f"CheckpointSlice({self._src.name!r}{region_text(self._bounds)} of {self._src.file.name})"


def open_checkpoint_slice(
    handle: Any, file: Path, name: str, param: torch.Tensor, quantization: Quantization | None = None,
    lookup: RegionLookup | None = None,
) -> CheckpointSlice:
    """The whole of tensor ``name`` of the open safetensors file ``handle``, bound for
    ``param``. Reads headers only; a quantized tensor whose scale is missing or of the wrong
    shape is refused here, before any loader sees it."""
    raw = open_slice(handle, file, name)
    shape, kind = tuple(raw.get_shape()), raw.get_dtype()
    if kind not in _DTYPES:
        raise CheckpointError(f"{where(file, name)} has dtype {kind!r}, which torch cannot hold; expected one of "
                              f"{sorted(_DTYPES)}")
    stored = _DTYPES[kind]
    scale = None
    if quantization is not None:
        if lookup is None:
            raise ValueError("a quantized checkpoint needs a lookup to read its scale tensors; got lookup=None")
        try:
            scale = quantization.scale_for(name, stored, shape, lookup)
        except ValueError as e:
            raise CheckpointError(f"{where(file, name)}: {e}") from e
    # a layer holding fp8 weights reads dense tensors in the model's dtype (``dense_dtype``)
    dtype = getattr(param, "dense_dtype", param.dtype)
    src = _Source(handle, raw, file, name, shape, stored, dtype, param.device, quantization, lookup, scale)
    return CheckpointSlice(src, tuple((0, n) for n in shape))
