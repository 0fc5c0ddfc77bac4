"""CR-BOUND-04 probes of the row-state snapshot options (prefix caching of recurrent
state, docs/hybrid_prefix_caching.md): ``mamba_block_size`` and ``mamba_cache_slots``."""
from __future__ import annotations

from core_runner.conformance.harness import Ctx, fail, greedy, run
from core_runner.conformance.options import _rejects, probe


def _snapshots_kept(ctx: Ctx) -> bool:
    return ctx.row_state and ctx.registration.capability("prefix_caching").supported


def _refused_unused(ctx: Ctx, name: str) -> str:
    """An engine that keeps no snapshots refuses the option by name (it would do nothing)."""
    opts = {name: 8, "block_size": 4}
    if ctx.row_state:
        opts["enable_prefix_caching"] = False
    _rejects(ctx, f"{name}=8 on an engine keeping no row-state snapshots", **opts)
    return f"refused where no row-state snapshot is kept ({'prefix caching off' if ctx.row_state else 'no row state'})"


@probe("mamba_block_size")
def _mamba_block_size(ctx: Ctx) -> str:
    text = _rejects(ctx, "mamba_block_size=6 with block_size=4 (not a multiple)", mamba_block_size=6, block_size=4)
    text += "; " + _refused_unused(ctx, "mamba_block_size")
    if not _snapshots_kept(ctx):
        return text
    prompt = ctx.ref.prompts([13], seed=19)[0]
    hits = {}
    for size in (None, 8):
        e = ctx.engine(block_size=4, mamba_block_size=size)
        for i in range(2):  # the second resumes from the first's snapshot
            run(e, [(f"p{i}", prompt, greedy(1))])
        hits[size] = e.scheduler.prefix_cache_hits
    if hits[None] or hits[8] != 8:
        fail(f"a repeated 13-token prompt found {hits[None]} cached tokens with the default mamba_block_size (512) "
             f"and {hits[8]} with 8; expected 0, then 8 (the one snapshot below its last token)")
    return text + "; a repeated 13-token prompt resumes at 8 tokens with mamba_block_size=8, nothing at the default"


@probe("mamba_cache_slots")
def _mamba_cache_slots(ctx: Ctx) -> str:
    text = _rejects(ctx, "mamba_cache_slots=0", mamba_cache_slots=0)
    text += "; " + _refused_unused(ctx, "mamba_cache_slots")
    if not _snapshots_kept(ctx):
        return text
    e = ctx.engine(block_size=4, mamba_block_size=4, mamba_cache_slots=3)
    rep = e.memory_report()
    if rep["state_snapshot_slots"] != 3 or rep["state_snapshot_bytes"] != 3 * rep["state_bytes_per_row"]:
        fail(f"mamba_cache_slots=3 reported {rep['state_snapshot_slots']} slots, {rep['state_snapshot_bytes']} bytes")
    run(e, [("long", ctx.ref.prompts([21], seed=23)[0], greedy(1))])
    kept = len(e.scheduler.kv.states.cached)
    if kept != 3:
        fail(f"a 21-token prompt (5 boundaries of 4 tokens) kept {kept} snapshots in 3 slots, expected 3 (LRU)")
    return text + "; 3 slots hold 3 snapshots (the oldest evicted) and are reported in memory_report()"
