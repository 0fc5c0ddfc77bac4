"""KVCacheManager.release_out_of_window walks only the blocks a window left since the
last step, and checks one group per window when nothing left it; it must free exactly what
a scan of the whole table frees, step after step, also when the table starts from a prefix
hit whose leading entries are NULL_BLOCK."""
import random

from core_runner.engine.kv_manager import NULL_BLOCK, KVCacheManager


def _reference_release(mgr: KVCacheManager, table: list[list[int]], num_computed: int) -> list[int]:
    """What a scan of every entry below each window's first needed block frees."""
    freed = []
    for g, ids in enumerate(table):
        w = mgr.windows[g]
        needed = 0 if w is None else max(0, num_computed - mgr.margin - w + 1) // mgr.block_size
        first = min(needed, len(ids))
        freed += [b for b in ids[:first] if b != NULL_BLOCK]
    return freed


def test_release_matches_a_full_scan_over_random_steps():
    rng = random.Random(0)
    for trial in range(20):
        bs, margin = 4, rng.choice([0, 3])
        w = rng.randint(5, 40)
        windows = [None, w, rng.randint(5, 40), w]  # two groups share a window, as Gemma 3's do
        mgr = KVCacheManager(windows, num_blocks=4096, block_size=bs, margin=margin)
        table, done = mgr.new_table(), 0
        while done < 400:
            step = rng.choice([1, 1, 1, 7, 33])
            want = _reference_release(mgr, [list(ids) for ids in table], done)
            released_before = sum(b == NULL_BLOCK for ids in table for b in ids)
            assert mgr.grow(table, done, done + step) is not None
            done += step
            held = mgr.held(table)
            assert not set(want) & set(held), (trial, done)
            # every block the full scan frees is released now, and nothing else
            released = sum(b == NULL_BLOCK for ids in table for b in ids)
            assert released - released_before == len(want), (trial, done)
            for ids in table:  # released entries stay a prefix
                k = sum(1 for b in ids if b == NULL_BLOCK)
                assert all(b == NULL_BLOCK for b in ids[:k]) and NULL_BLOCK not in ids[k:]
            assert mgr.pool.num_free == 4096 - len(held), (trial, done)
        mgr.free(table)
        assert mgr.pool.num_free == 4096


def test_release_after_a_prefix_hit_frees_only_live_blocks():
    mgr = KVCacheManager([None, 8, 8], num_blocks=64, block_size=4)
    table = mgr.new_table()
    mgr.grow(table, 0, 40)
    hashes = list(range(10))
    mgr.cache(table, hashes, 0, 10)
    mgr.free(table)
    hit, n = mgr.take_cached(hashes, limit=10, drop_last=False)
    assert n == 10 and hit[1][0] == NULL_BLOCK  # the windowed group resumes from its window's blocks
    held_before = mgr.held(hit)
    mgr.grow(hit, 40, 44)
    # the window (8 tokens) at 40 computed needs blocks from 33 // 4 = 8 on: 8 and 9 stay
    for g in (1, 2):
        assert hit[g][:8] == [NULL_BLOCK] * 8 and NULL_BLOCK not in hit[g][8:]
    assert set(mgr.held(hit)) - set(held_before) and mgr.pool.num_free == 64 - len(mgr.held(hit))
