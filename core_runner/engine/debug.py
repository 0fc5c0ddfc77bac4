"""EngineDebug: the documented inspection and fault-injection API (``engine.debug``).

Tests and the conformance suite observe and steer an engine only through this object
and the public API, never by patching methods or reading private attributes. It costs
nothing until used: recording logits copies them to the host every step, so it is on
only between ``record_steps()`` and ``stop_recording()``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from core_runner.kv_cache_spec import PagedCacheSpec, RowStateSpec
from core_runner.step_data.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from core_runner.engine.llm_engine import LLMEngine


@dataclass
class StepRecord:
    """One real step as the runner executed it (logits: float32 on the host)."""

    req_ids: list[str]
    num_scheduled: dict[str, int]
    num_computed: dict[str, int]
    rows: dict[str, int]
    new_req_ids: list[str]
    preempted: set[str]
    finished: set[str]
    logits: dict[str, torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_scheduled.values())


class EngineDebug:
    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self.steps: list[StepRecord] = []
        self._pending: tuple[list[str], torch.Tensor] | None = None
        self._recording = False

    # ---- observing steps ----------------------------------------------------------
    def record_steps(self) -> list[StepRecord]:
        """Start recording every real step (with its logits); returns the live list."""
        if not self._recording:
            self._engine.runner.logits_hooks.append(self._on_logits)
            self._engine.core.step_hooks.append(self._on_step)
            self._recording = True
        return self.steps

    def stop_recording(self) -> None:
        """Stop recording; the list keeps what it holds, and ``record_steps()`` appends to it again."""
        if self._recording:
            self._engine.runner.logits_hooks.remove(self._on_logits)
            self._engine.core.step_hooks.remove(self._on_step)
            self._recording = False

    def on_logits(self, fn: Callable[[list[str], torch.Tensor], None]) -> Callable[[], None]:
        """Call ``fn(req_ids, logits)`` after every real step's logits (device tensors, batch
        order); returns a function that removes the hook."""
        hooks = self._engine.runner.logits_hooks
        hooks.append(fn)
        return lambda: hooks.remove(fn)

    def on_step(self, fn: Callable[[SchedulerOutput], None]) -> Callable[[], None]:
        """Call ``fn(scheduler_output)`` after each step is launched; returns a remover."""
        hooks = self._engine.core.step_hooks
        hooks.append(fn)
        return lambda: hooks.remove(fn)

    def before_step(self, fn: Callable[[SchedulerOutput], None]) -> Callable[[], None]:
        """Call ``fn(scheduler_output)`` just before each step is handed to the runner (the
        rows, tables and ModelState are as the previous step left them); returns a remover.
        With ``on_step`` it brackets exactly one ``execute_model`` call. Neither hook sees
        ``engine.dummy_run``; a caller that runs one brackets it itself."""
        hooks = self._engine.core.pre_step_hooks
        hooks.append(fn)
        return lambda: hooks.remove(fn)

    def _on_logits(self, req_ids: list[str], logits: torch.Tensor) -> None:
        self._pending = (list(req_ids), logits.float().cpu())

    def _on_step(self, out: SchedulerOutput) -> None:
        if self._pending is None:
            return
        req_ids, logits = self._pending
        self._pending = None
        rows = self.rows()
        self.steps.append(StepRecord(
            req_ids=req_ids, num_scheduled=dict(out.num_scheduled_tokens), num_computed=dict(out.num_computed_tokens),
            rows={r: rows[r] for r in req_ids}, new_req_ids=[n.req_id for n in out.new_reqs],
            preempted=set(out.preempted_req_ids), finished=set(out.finished_req_ids),
            logits={r: logits[i].clone() for i, r in enumerate(req_ids)},
        ))

    # ---- steering -----------------------------------------------------------------
    def preempt(self, req_id: str) -> None:
        """Preempt a running request by recompute, as a dry KV pool would."""
        self._engine.scheduler.force_preempt(req_id)

    def preemptible(self) -> list[str]:
        """Running requests with no sampled token in flight (those ``preempt`` accepts)."""
        return [r.req_id for r in self._engine.scheduler.running if r.num_pending == 0]

    # ---- state --------------------------------------------------------------------
    def rows(self) -> dict[str, int]:
        """The runner row of every request that holds one."""
        return dict(self._engine.runner.req_state.req_id_to_row)

    def row_of(self, req_id: str) -> int | None:
        return self._engine.runner.req_state.req_id_to_row.get(req_id)

    def row_tables(self) -> dict[str, torch.Tensor]:
        """Every per-row device table (dim 0 = row): the runner's request state, the sampler's
        settings, the ModelState's ``row_buffers()`` and the row caches the runner allocated
        for its ``RowStateSpec``s (``row_cache.<layer>.<i>``, one per tensor), named by owner."""
        runner = self._engine.runner
        out = {f"req_state.{k}": t for k, t in runner.req_state.tables().items()}
        out.update({f"sampling.{k}": t for k, t in runner.sampling.tables().items()})
        out.update({f"model_state.{k}": t for k, t in runner.model_state.row_buffers().items()})
        for spec in runner.cache_specs():
            if isinstance(spec, RowStateSpec):
                for i, t in enumerate(runner.kv_caches[spec.layer_name]):
                    out[f"row_cache.{spec.layer_name}.{i}"] = t
        return out

    def paged_caches(self) -> dict[str, torch.Tensor]:
        """The paged KV caches (``kv.<layer>``; dim 1 = block, dim 2 = slot in the block)."""
        runner = self._engine.runner
        return {f"kv.{spec.layer_name}": runner.kv_caches[spec.layer_name]
                for spec in runner.cache_specs() if isinstance(spec, PagedCacheSpec)}

    def sampling_host_state(self) -> dict:
        """A copy of every sampling stage's host mirrors (settings, users), by stage."""
        return self._engine.runner.sampling.host_state()

    @property
    def model(self) -> torch.nn.Module:
        """The plugin's model as rank 0's runner runs it: its module tree follows the
        checkpoint's names (``model.layers.0.mlp``, ...). For inspection only, such as
        forward hooks; they fire on eager steps (a CUDA graph replay runs no module)."""
        return self._engine.runner.model

    @property
    def num_rows(self) -> int:
        return self._engine.runner.req_state.num_rows

    @property
    def graph_replays(self) -> int:
        graphs = self._engine.runner.graphs
        return 0 if graphs is None else sum(graphs.replays.values())

    @property
    def num_dummy_runs(self) -> int:
        return self._engine.runner.num_dummy_runs

    def kv_cache_groups(self) -> list[dict]:
        """Each KV cache group (kv_cache_groups.py): its sliding window (None: full), its
        layers, and the distinct blocks its running requests hold now."""
        sched = self._engine.scheduler
        out = []
        for g, grp in enumerate(self._engine.runner.kv_layout.groups):
            held = {b for r in sched.requests.values() for b in r.block_ids[g] if b >= 0}
            out.append({"sliding_window": grp.sliding_window, "layers": list(grp.layer_names),
                        "blocks_held": len(held)})
        return out

    def blocks_held(self, req_id: str) -> list[int]:
        """Blocks request ``req_id`` holds now, per KV cache group."""
        req = self._engine.scheduler.requests[req_id]
        return [sum(1 for b in ids if b >= 0) for ids in req.block_ids]

    @property
    def num_free_blocks(self) -> int:
        return self._engine.scheduler.pool.num_free

    @property
    def num_preemptions(self) -> int:
        return self._engine.scheduler.num_preemptions
