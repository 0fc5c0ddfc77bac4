"""The pool of KV-cache block ids shared by every paged layer, with the prefix cache.

A block is free or held by requests. A full block whose KV is computed may also carry a
hash (``block_hash``): a later request whose
prompt starts with the same blocks takes them instead of computing them (``touch``), so
a block may be shared, and is free again only when no request holds it (reference
counts). A free block that still carries a hash stays findable until it is needed:
allocation takes blocks without a hash first, then evicts cached ones least recently
freed first (an LRU). Within one request, blocks are freed last-first so that a prefix's
tail is evicted before its head, which other requests are likelier to share.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from core_runner.engine.block_hash import BlockHash


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        # 0: a model without paged layers, which never asks for a block
        if num_blocks < 0:
            raise ValueError(f"num_blocks={num_blocks} must be >= 0")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))  # free, no hash
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free, hash kept: the LRU
        self.ref_count = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._cached_free)

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise RuntimeError(f"asked for {n} KV blocks, only {self.num_free} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.popleft()
            else:
                b, _ = self._cached_free.popitem(last=False)
                self._forget(b)
            self.ref_count[b] = 1
            out.append(b)
        return out

    def free(self, block_ids: list[int], uncache: bool = False) -> None:
        """Release one reference to each block (last block first). ``uncache``: drop the
        hash of a block that becomes free (its KV may be unfinished: a failed step)."""
        for b in reversed(block_ids):
            self.ref_count[b] -= 1
            if self.ref_count[b]:
                continue
            if uncache:
                self._forget(b)
            if self.block_hash[b] is None:
                self._free.append(b)
            else:
                self._cached_free[b] = None

    # ---- prefix cache -----------------------------------------------------------------
    def lookup(self, hashes: list[BlockHash]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (not yet referenced)."""
        hit = []
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference to cached blocks found by ``lookup``."""
        for b in block_ids:
            if self.ref_count[b] == 0:
                del self._cached_free[b]
            self.ref_count[b] += 1

    def cache(self, block_id: int, block_hash: BlockHash) -> None:
        """Make a held block findable under ``block_hash`` (its KV is written by the time a
        later step reads it). A hash already cached elsewhere keeps its block."""
        if self.block_hash[block_id] is not None or block_hash in self.cached:
            return
        self.block_hash[block_id] = block_hash
        self.cached[block_hash] = block_id

    def _forget(self, b: int) -> None:
        h = self.block_hash[b]
        if h is not None:
            self.block_hash[b] = None
            if self.cached.get(h) == b:
                del self.cached[h]

    def reset(self) -> int:
        """Drop every hash (held blocks keep running, uncached); returns how many were dropped."""
        n = len(self.cached)
        for b in list(self.cached.values()):
            self._forget(b)
        self._free.extend(self._cached_free)
        self._cached_free.clear()
        return n
