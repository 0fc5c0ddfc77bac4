"""Block bookkeeping per KV cache group (``core_runner.kv_cache_groups``) for the scheduler.

A request holds one list of block ids per group, indexed by block position (block i
holds tokens [i * block_size, (i + 1) * block_size)). In a sliding-window group a block
that every future query's window has left is given back to the pool and its entry
becomes ``NULL_BLOCK``; no attention kernel reads it (they start at the first row's
window). "Future" allows for speculation: a verification step may roll back up to
``margin`` (= proposals per step) positions, so those stay held.

Prefix cache: blocks are registered per group under (group, chained block hash). A hit
of H blocks needs, in a full group, blocks [0, H) and, in a group with window w, the
blocks from the one holding position H * block_size - w + 1 up to H - 1: the first
computed query then finds every key of its window (vLLM's sliding-window hit rule).
The longest H that every group satisfies is taken.

No group at all (``windows=[]``, an attention-free model): a request's table is empty,
growing never needs a block, and the pool has none.

Row-state snapshots (``state_slots`` > 0, docs/hybrid_prefix_caching.md): a model with
per-row recurrent state resumes a hit only where a snapshot of that state exists, at a
multiple of ``state_blocks`` blocks; ``states`` is a second pool of snapshot slots keyed
by the chained hash of the block that ends at the boundary (same ref counts and LRU).
"""
from __future__ import annotations

from core_runner.engine.block_pool import BlockPool

NULL_BLOCK = -1


class KVCacheManager:
    def __init__(self, windows: list[int | None], num_blocks: int, block_size: int, margin: int = 0,
                 state_slots: int = 0, state_blocks: int = 0) -> None:
        self.windows = list(windows)
        # the windowed groups by window (Gemma 3: one window shared by several groups), so
        # each step's release works out the first needed block once per window
        self._by_window: dict[int, list[int]] = {}
        for g, w in enumerate(self.windows):
            if w is not None:
                self._by_window.setdefault(w, []).append(g)
        self._windowed = bool(self._by_window)
        self.block_size = block_size
        self.margin = margin
        self.pool = BlockPool(num_blocks)
        # snapshot slots of row state, one every state_blocks blocks (None: no row state kept)
        self.states = BlockPool(state_slots) if state_slots else None
        self.state_blocks = state_blocks

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def new_table(self) -> list[list[int]]:
        return [[] for _ in self.windows]

    def held(self, table: list[list[int]]) -> list[int]:
        return [b for ids in table for b in ids if b != NULL_BLOCK]

    def free(self, table: list[list[int]], uncache: bool = False) -> None:
        for ids in table:
            self.pool.free([b for b in ids if b != NULL_BLOCK], uncache=uncache)

    def _window_start(self, window: int, num_computed: int) -> int:
        """The first block a future query of a window this wide can still read."""
        return max(0, num_computed - self.margin - window + 1) // self.block_size

    def release_out_of_window(self, table: list[list[int]], num_computed: int) -> None:
        if not self._windowed:  # every group keeps the whole sequence: nothing ever leaves
            return
        for w, groups in self._by_window.items():
            needed = self._window_start(w, num_computed)
            head = table[groups[0]]
            first = min(needed, len(head))
            if first == 0 or head[first - 1] == NULL_BLOCK:
                # groups of one window hold and release the same positions (grown together,
                # resumed from the same hit), so most steps end here, one check per window
                continue
            for g in groups:
                ids = table[g]
                first = min(needed, len(ids))
                # released entries always form a prefix (here and in take_cached), so only the
                # blocks the window left since the last step are looked at: a walk over the whole
                # prefix every step cost Gemma-3 decode ~5 ms of host time a step at 8k contexts
                live = first
                while live > 0 and ids[live - 1] != NULL_BLOCK:
                    live -= 1
                if live < first:
                    self.pool.free(ids[live:first])
                    ids[live:first] = [NULL_BLOCK] * (first - live)

    def grow(self, table: list[list[int]], num_computed: int, end: int) -> list[list[int]] | None:
        """Blocks up to token ``end`` in every group (None: the pool cannot supply them);
        blocks the windows have left are released first."""
        self.release_out_of_window(table, num_computed)
        want = -(-end // self.block_size)
        if not table or min(map(len, table)) >= want:  # most decode steps: the last block has room
            return [[] for _ in table]
        need = [max(0, want - len(ids)) for ids in table]
        total = sum(need)
        if total > self.pool.num_free:
            return None
        new = [self.pool.allocate(n) if n else [] for n in need]
        for ids, more in zip(table, new):
            ids.extend(more)
        return new

    # ---- prefix cache -----------------------------------------------------------------
    def cache(self, table: list[list[int]], hashes: list, start: int, end: int) -> None:
        for g, ids in enumerate(table):
            for i in range(start, end):
                if ids[i] != NULL_BLOCK:
                    self.pool.cache(ids[i], (g, hashes[i]))

    def _valid(self, g: int, n: int, found: list[list[bool]]) -> bool:
        lo = self._first_needed_for_hit(g, n)
        return all(found[g][lo:n])

    def _first_needed_for_hit(self, g: int, n: int) -> int:
        w = self.windows[g]
        return 0 if w is None else max(0, n * self.block_size - w + 1) // self.block_size

    def _state_bound(self, n: int, snap: list[bool] | None) -> int:
        """The longest hit <= n whose row state is kept: a multiple of state_blocks with a snapshot."""
        if snap is None:
            return n
        n -= n % self.state_blocks
        while n > 0 and not snap[n - 1]:
            n -= self.state_blocks
        return n

    def _longest_hit(self, bound: int, found: list[list[bool]], snap: list[bool] | None = None) -> int:
        n = bound
        while n > 0:
            best = self._state_bound(n, snap)
            for g in range(self.num_groups):
                while best > 0 and not self._valid(g, best, found):
                    best -= 1
            if best == n:
                return n
            n = best
        return 0

    def take_cached(self, hashes: list, limit: int, drop_last: bool) -> tuple[list[list[int]], int]:
        """The longest cached prefix of at most ``limit`` blocks every group can resume
        from (one fewer with ``drop_last``); its blocks are referenced. Returns the table
        (NULL_BLOCK where a window needs nothing) and the number of blocks hit."""
        snap = None if self.states is None else [h in self.states.cached for h in hashes[:limit]]
        if not self.num_groups and snap is None:  # nothing cached at all: every group "agreeing" is no hit
            return self.new_table(), 0
        found = [[(g, h) in self.pool.cached for h in hashes[:limit]] for g in range(self.num_groups)]
        n = self._longest_hit(limit, found, snap)
        if drop_last and n:
            n = self._longest_hit(n - 1, found, snap)
        table = self.new_table()
        if not n:
            return table, 0
        for g in range(self.num_groups):
            lo = self._first_needed_for_hit(g, n)
            hit = [self.pool.cached[(g, h)] for h in hashes[lo:n]]
            self.pool.touch(hit)
            table[g] = [NULL_BLOCK] * lo + hit
        return table, n

    # ---- row-state snapshots ----------------------------------------------------------
    def state_slot_of(self, block_hash) -> int:
        """The snapshot slot of the row state after the block ``block_hash`` (-1: none); a
        hit refreshes it in the LRU. The restore is staged before any later save into it."""
        slot = -1 if self.states is None else self.states.cached.get(block_hash, -1)
        if slot >= 0:
            self.states.touch([slot])
            self.states.free([slot])
        return slot
