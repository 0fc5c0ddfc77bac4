"""Persistent engine state as the hygiene checks see it: every per-row buffer, the KV
caches, host bookkeeping; snapshots, diffs and garbage.

Per-row buffers are the runner's RequestState and SamplingState tables, the
ModelState's ``row_buffers()`` (which must list every per-row tensor the state owns:
other tensors, such as per-step scratch at a fixed address, may change in any step) and
row caches (``RowStateSpec``) allocated by the runner.
"""
from __future__ import annotations

from typing import Any

import torch


def row_tables(engine: Any) -> dict[str, torch.Tensor]:
    """Every per-row tensor of the runner, the sampling state, the ModelState and the row
    caches (dim 0 = row), as ``engine.debug.row_tables()`` names them; a ModelState row
    buffer with another number of rows than the runner's is an error."""
    num_rows = engine.debug.num_rows
    tables = engine.debug.row_tables()
    for name, t in tables.items():
        if name.startswith("model_state.") and t.shape[0] != num_rows:
            raise AssertionError(f"{name} from row_buffers() has {t.shape[0]} rows, the runner has {num_rows}")
    return tables


def paged_caches(engine: Any) -> dict[str, torch.Tensor]:
    return engine.debug.paged_caches()


def snapshot(engine: Any) -> dict[str, Any]:
    """Everything persistent: device tables, caches, and host bookkeeping."""
    rs, ss = engine.runner.req_state, engine.runner.sampling
    snap: dict[str, Any] = {k: t.detach().clone() for k, t in {**row_tables(engine), **paged_caches(engine)}.items()}
    for name, value in vars(engine.model_state).items():
        if isinstance(value, (int, float, bool, str)) or value is None:
            snap[f"host.model_state.{name}"] = value
    snap["host.req_id_to_row"] = engine.debug.rows()
    snap["host.free_rows"] = list(rs.free_rows)
    snap["host.num_blocks_cpu"] = [list(c) for c in rs.num_blocks_cpu]
    snap["host.sampling"] = engine.debug.sampling_host_state()
    staged = [v for v in (*vars(rs).values(), *vars(ss).values()) if hasattr(v, "has_staged")]
    snap["host.staged"] = [t.has_staged for t in staged]
    sched = engine.scheduler
    snap["host.scheduler"] = (
        engine.debug.num_free_blocks, engine.debug.num_preemptions, [r.req_id for r in sched.running],
        [r.req_id for r in sched.waiting],
        {rid: (r.num_computed_tokens, [list(b) for b in r.block_ids], list(r.output_token_ids))
         for rid, r in sched.requests.items()},
    )
    return snap


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def snapshot_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    diffs = [f"{k} appeared or vanished" for k in sorted(a.keys() ^ b.keys())]
    for k in a.keys() & b.keys():
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                diffs.append(f"{k} changed shape/dtype")
            elif not torch.equal(_bits(x), _bits(y)):
                diffs.append(f"{k} ({int((x != y).sum())} elements changed)")
        elif x != y:
            diffs.append(f"{k}: {x!r} -> {y!r}")
    return sorted(diffs)


def fill_garbage(t: torch.Tensor, index: Any, gen: torch.Generator, int_high: int = 64) -> None:
    """Overwrite t[index] with values unlike a fresh (zero) table yet plausible enough not
    to crash a reader: ints in [1, int_high), floats in (0.05, 0.95), booleans True."""
    view = t[index]
    if t.dtype == torch.bool:
        vals = torch.ones(view.shape, dtype=torch.bool)
    elif t.dtype.is_floating_point:
        vals = torch.rand(view.shape, generator=gen) * 0.9 + 0.05
    else:
        vals = torch.randint(1, int_high, view.shape, generator=gen)
    t[index] = vals.to(device=t.device, dtype=t.dtype)


def free_block_ids(engine: Any) -> list[int]:
    used = {b for r in engine.scheduler.requests.values() for b in engine.scheduler.kv.held(r.block_ids)}
    return [b for b in range(engine.num_blocks) if b not in used]


def fill_free_blocks_with_garbage(engine: Any, gen: torch.Generator) -> int:
    free = torch.tensor(free_block_ids(engine), dtype=torch.long)
    for cache in paged_caches(engine).values():
        idx = free.to(cache.device)
        shape = cache[:, idx].shape
        cache[:, idx] = (torch.randn(shape, generator=gen) * 10).to(device=cache.device, dtype=cache.dtype)
    return int(free.numel())
