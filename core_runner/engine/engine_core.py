"""EngineCore: the step loop, schedule -> execute -> update.

With async scheduling one step stays in flight: step N+1 is scheduled and launched
before step N's sampled tokens are read, so the host's scheduling overlaps the device's
work. The core deals in Requests only; text and output records belong to the
OutputProcessor, validation to the InputProcessor.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from core_runner.engine.request import Request
from core_runner.engine.scheduler import Scheduler
from core_runner.runner.async_output import AsyncOutput
from core_runner.runner.model_runner import ModelRunner
from core_runner.step_data.scheduler_output import SchedulerOutput


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

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def abort(self, req_id: str) -> Request | None:
        return self.scheduler.abort(req_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.in_flight)

    def step(self) -> list[Request]:
        """Launch one step; return the requests finished by the oldest step in flight."""
        out = self.scheduler.schedule()
        if not out.is_empty or out.finished_req_ids or out.preempted_req_ids or out.new_reqs:
            for hook in self.pre_step_hooks:
                hook(out)
            self.in_flight.append((out, self.runner.execute_model(out)))
            for hook in self.step_hooks:
                hook(out)
        finished = []
        while self.in_flight and (len(self.in_flight) > self.depth or out.is_empty):
            done_out, handle = self.in_flight.popleft()
            finished += self.scheduler.update_from_output(done_out, handle.get())
            if out.is_empty:
                break
        return finished

    def dummy_run(self, num_reqs: int, num_tokens: int) -> None:
        """A step over the scratch row that changes no request's state (profiling, warm-up)."""
        so = SchedulerOutput(num_scheduled_tokens={f"d{i}": 1 for i in range(num_reqs)})
        so.num_scheduled_tokens[f"d{num_reqs - 1}"] += max(0, num_tokens - num_reqs)
        self.runner.execute_model(so, dummy=True)
