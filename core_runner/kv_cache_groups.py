"""KV cache groups: which paged layers share a block table, and which share memory.

Layers that attend the same way (full causal, or one sliding window) form a group: a
request holds one list of block ids per group, and a windowed group's blocks are freed
once every window has left them, so its memory follows the window (vLLM's hybrid
allocator and sliding-window manager, simplified).

Memory. With one group every layer owns a tensor ``[parts, num_blocks, ...]`` and a block
id is a page of all of them (as before groups existed). With several groups the pool is
still one list of block ids, but a block id now belongs to one group at a time, so
layers of different groups *share* tensors: each group is cut into chunks of G layers
(G = the smallest group's size), and layer j of every chunk uses slot tensor j. A block
id then costs G pages instead of one page per layer: a Gemma-3-shaped model (5 local to
1 global) holds about local_layers x window + global_layers x context tokens of KV, not
all_layers x context. Sharing needs every paged layer to have the same page (parts,
heads, head size, dtype); a model whose layers differ keeps one group (windows are still
applied by attention, but no block is freed early) and says so in the log.

Group 0 is the full-attention group when there is one (drafter layers attend fully, and
the drafter reads group 0's table).

A model without paged layers (attention-free: Mamba2, whose state is per request row,
``RowStateSpec``) has zero groups: no block is ever allocated, the pool costs nothing
and the engine sizes no pool at all.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from core_runner.kv_cache_spec import KVCacheSpec, PagedCacheSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers that share a block table; ``sliding_window`` None = full attention."""

    sliding_window: int | None
    layer_names: tuple[str, ...]


@dataclass(frozen=True)
class KVCacheLayout:
    groups: tuple[KVCacheGroup, ...]
    #: with several groups: slot tensor j is shared by these layers (one per group chunk)
    slots: tuple[tuple[str, ...], ...] = ()

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def group_of(self) -> dict[str, int]:
        return {name: g for g, grp in enumerate(self.groups) for name in grp.layer_names}

    def pool_bytes_per_token(self, specs: list[KVCacheSpec]) -> int:
        """What one block id costs, per token of the block."""
        paged = {s.layer_name: s for s in specs if isinstance(s, PagedCacheSpec)}
        if not self.slots:
            return sum(s.bytes_per_token() for s in paged.values())
        return sum(paged[names[0]].bytes_per_token() for names in self.slots)

    def allocate(self, specs: list[KVCacheSpec], num_blocks: int, block_size: int,
                 device: torch.device | str) -> dict[str, torch.Tensor]:
        paged = {s.layer_name: s for s in specs if isinstance(s, PagedCacheSpec)}
        if not self.slots:
            return {name: s.allocate(num_blocks, block_size, device) for name, s in paged.items()}
        out = {}
        for names in self.slots:
            t = paged[names[0]].allocate(num_blocks, block_size, device)
            out.update({name: t for name in names})
        return out


def plan_kv_cache_layout(specs: list[KVCacheSpec]) -> KVCacheLayout:
    paged = [s for s in specs if isinstance(s, PagedCacheSpec)]
    if not paged:  # attention-free: nothing is paged, so no group and no block table is used
        return KVCacheLayout(())
    by_window: dict[int | None, list[str]] = {}
    for s in paged:
        by_window.setdefault(s.sliding_window, []).append(s.layer_name)
    if len(by_window) <= 1:
        window = next(iter(by_window), None)
        return KVCacheLayout((KVCacheGroup(window, tuple(s.layer_name for s in paged)),))
    pages = {(s.num_parts, s.num_heads, s.head_size, s.dtype) for s in paged}
    if len(pages) > 1:
        logger.warning("KV cache: layers with sliding windows %s have different page shapes %s, so they cannot "
                       "share memory; every block is kept for the whole sequence (windows still apply)",
                       sorted(k for k in by_window if k is not None), sorted(map(str, pages)))
        return KVCacheLayout((KVCacheGroup(None, tuple(s.layer_name for s in paged)),))
    size = min(len(v) for v in by_window.values())
    order = sorted(by_window, key=lambda w: (w is not None, w or 0))  # full attention first
    groups = []
    for w in order:
        names = by_window[w]
        groups += [KVCacheGroup(w, tuple(names[i:i + size])) for i in range(0, len(names), size)]
    slots = tuple(tuple(g.layer_names[j] for g in groups if j < len(g.layer_names)) for j in range(size))
    return KVCacheLayout(tuple(groups), slots)
