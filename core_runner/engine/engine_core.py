"""EngineCore: the step loop, schedule -> execute -> update.

With async scheduling one step stays in flight: step N+1 is scheduled and launched
before step N's sampled tokens are read, so the host's scheduling overlaps the device's
work. The core deals in Requests only; text and output records belong to the
OutputProcessor, validation to the InputProcessor.

A fault inside a step (a plugin's forward raising, a device error surfacing when the
outputs are read, Ctrl-C) must never wedge the engine: the requests whose state the
fault leaves unknown (those scheduled in the failed step and in every step still in
flight) finish with ``finish_reason="error"``, their rows, blocks and pending counts are
freed, and the next step runs the other requests. They are not retried: a forward that
raised once would most likely raise again, and a retry could emit tokens twice. Under
tensor parallelism a failed step stops the engine (``EngineDeadError``, re-raised after
the same cleanup): the ranks' collectives can no longer be matched.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from core_runner.engine.request import Request
from core_runner.engine.scheduler import Scheduler
from core_runner.executor.errors import EngineDeadError
from core_runner.runner.async_output import AsyncOutput
from core_runner.runner.model_runner import ModelRunner
from core_runner.step_data.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, async_scheduling: bool) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.in_flight: deque[tuple[SchedulerOutput, AsyncOutput]] = deque()
        self.depth = 1 if async_scheduling else 0
        # called with each step's SchedulerOutput just before / after it is launched
        # (see core_runner.engine.debug)
        self.pre_step_hooks: list[Callable[[SchedulerOutput], None]] = []
        self.step_hooks: list[Callable[[SchedulerOutput], None]] = []
        # requests failed by a step that re-raised (Ctrl-C): returned by the next step
        self.carried: list[Request] = []

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def abort(self, req_id: str) -> Request | None:
        return self.scheduler.abort(req_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.in_flight) or bool(self.carried)

    def forget(self, req_ids: set[str]) -> None:
        """Drop these requests' unreturned outputs (their owner gave up on them)."""
        self.carried = [r for r in self.carried if r.req_id not in req_ids]

    def step(self) -> list[Request]:
        """Launch one step; return the requests finished by the oldest step in flight.

        If the step raises, the requests it leaves in an unknown state are returned
        finished with ``finish_reason="error"`` (see the module docstring); a
        KeyboardInterrupt (or another BaseException) is cleaned up the same way, then
        re-raised, and the requests it failed are returned by the next step."""
        # every SchedulerOutput whose results have not been fully applied yet; None while
        # schedule() itself runs (a fault there leaves every running request unknown)
        unsettled: list[SchedulerOutput | None] = [None, *(o for o, _ in self.in_flight)]
        finished, self.carried = self.carried, []
        try:
            out = self.scheduler.schedule()
            finished += self.scheduler.failed_at_admission
            self.scheduler.failed_at_admission = []
            unsettled = [out, *(o for o, _ in self.in_flight)]
            if not out.is_empty or out.finished_req_ids or out.preempted_req_ids or out.new_reqs:
                for hook in self.pre_step_hooks:
                    hook(out)
                self.in_flight.append((out, self.runner.execute_model(out)))
                for hook in self.step_hooks:
                    hook(out)
            while self.in_flight and (len(self.in_flight) > self.depth or out.is_empty):
                done_out, handle = self.in_flight[0]
                result = handle.get()
                self.in_flight.popleft()
                self.scheduler.update_from_output(done_out, result, finished)
                if out.is_empty:
                    break
        except BaseException as exc:
            finished += self._fail_step(unsettled, exc)
            if not isinstance(exc, Exception) or isinstance(exc, EngineDeadError):
                self.carried = finished
                raise
        return finished

    def _fail_step(self, unsettled: list[SchedulerOutput | None], exc: BaseException) -> list[Request]:
        """Finish with "error" every request whose state the fault left unknown, free their
        rows and blocks, and drop the steps in flight (their results cannot be trusted)."""
        sched = self.scheduler
        ids = {r.req_id for r in sched.running} if None in unsettled else set()
        for so in filter(None, unsettled):
            ids |= so.num_scheduled_tokens.keys() | so.sample_req_ids | {n.req_id for n in so.new_reqs}
        self.in_flight.clear()
        failed = sched.fail(sorted(ids))
        # only a running request may hold a row now: the failed step may not have reached
        # the removals it carried (finished and preempted requests)
        running = {r.req_id for r in sched.running}
        self.runner.reset_rows(sorted(r for r in self.runner.req_state.req_id_to_row if r not in running))
        logger.error("step failed with %s: %s; finished %d request(s) with finish_reason='error': %s",
                     type(exc).__name__, exc, len(failed), [r.req_id for r in failed],
                     exc_info=isinstance(exc, Exception))
        return failed

    def dummy_run(self, num_reqs: int, num_tokens: int) -> None:
        """A step over the scratch row that changes no request's state (profiling, warm-up)."""
        so = SchedulerOutput(num_scheduled_tokens={f"d{i}": 1 for i in range(num_reqs)})
        so.num_scheduled_tokens[f"d{num_reqs - 1}"] += max(0, num_tokens - num_reqs)
        self.runner.execute_model(so, dummy=True)
