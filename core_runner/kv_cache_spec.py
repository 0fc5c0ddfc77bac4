"""What a layer needs kept between steps, declared so the engine can size memory.

Two kinds cover every family: paged per-token caches addressed through block tables
(attention K/V, MLA latent) and per-request row state (Mamba conv/SSM state).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedCacheSpec:
    """Per-token entries in pages of ``block_size`` tokens.

    The cache tensor is ``[num_parts, num_blocks, block_size, num_heads, head_size]``:
    two parts (K and V) for attention, one part with one head for an MLA latent.
    ``sliding_window``: the layer reads only the last ``sliding_window`` positions, so the
    block manager may free blocks that every window has left. ``features``: the attention
    options the layer asks of the backend (``core_runner.attention.options``); the engine
    refuses a backend that lacks one.
    """

    layer_name: str
    num_heads: int
    head_size: int
    dtype: torch.dtype
    num_parts: int = 2
    sliding_window: int | None = None
    features: frozenset[str] = frozenset()

    def bytes_per_token(self) -> int:
        return self.num_parts * self.num_heads * self.head_size * self.dtype.itemsize

    def allocate(self, num_blocks: int, block_size: int, device: torch.device | str) -> torch.Tensor:
        shape = (self.num_parts, num_blocks, block_size, self.num_heads, self.head_size)
        return torch.zeros(shape, dtype=self.dtype, device=device)


@dataclass(frozen=True)
class RowStateSpec:
    """Fixed-size state per request row (for example a conv window and an SSM state).

    Allocated as one tensor ``[num_rows, *shape]`` per entry of ``shapes``. The last
    ``scratch`` entries are per-step working space (e.g. a verification step's per-position
    states), not state carried between steps: prefix-cache snapshots leave them out.
    """

    layer_name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    scratch: int = 0

    def persistent(self) -> RowStateSpec:
        """This spec without its scratch entries: what a snapshot of the row keeps."""
        n = len(self.shapes) - self.scratch
        return RowStateSpec(self.layer_name, self.shapes[:n], self.dtypes[:n])

    def bytes_per_row(self) -> int:
        total = 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            n = 1
            for s in shape:
                n *= s
            total += n * dtype.itemsize
        return total

    def allocate(self, num_rows: int, device: torch.device | str) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.zeros((num_rows, *shape), dtype=dtype, device=device)
            for shape, dtype in zip(self.shapes, self.dtypes)
        )


KVCacheSpec = PagedCacheSpec | RowStateSpec


def collect_kv_cache_specs(model: torch.nn.Module, dtype: torch.dtype, prefix: str = "") -> list[KVCacheSpec]:
    """Ask every layer of ``model`` that keeps a cache (has ``kv_cache_spec``) for its spec,
    named ``prefix`` + its module path."""
    specs = []
    for name, module in model.named_modules():
        fn = getattr(module, "kv_cache_spec", None)
        if callable(fn):
            specs.append(fn(prefix + name, dtype))
    return specs
