"""The suite's pytest items: one per (check x registration x example or capability).

pytest reaches this file through ``pytest --pyargs core_runner.conformance --cr-plugin
NAME``; the conformance session turns it into items generated from the plugin's
registrations. Each item runs one check function from ``catalog.CHECKS`` with a
``harness.Ctx``; a failed claim raises ``CheckFailure``, reported as the check's id, its
statement and what was observed.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pytest

from core_runner.conformance.catalog import Check
from core_runner.conformance.harness import CheckFailure, Ctx, Example
from core_runner.registry import Registration


@dataclass
class Case:
    check: Check
    label: str
    registration: Registration | None = None
    example: Example | None = None
    capability: str | None = None
    xfail: str | None = None  # reason: the capability is declared xfail
    skip: str | None = None  # reason it cannot run here ("not run: ...")

    @property
    def name(self) -> str:
        return f"{self.check.id}[{self.label}]"


class SuiteFile(pytest.File):
    def collect(self) -> Any:
        session = self.session_obj
        for case in session.cases():
            item = CheckItem.from_parent(self, name=case.name, case=case)
            if case.xfail:
                item.add_marker(pytest.mark.xfail(reason=f"declared xfail: {case.xfail}", strict=True))
            yield item


class CheckItem(pytest.Item):
    def __init__(self, *, case: Case, **kw: Any) -> None:
        super().__init__(**kw)
        self.case = case
        self.add_marker(getattr(pytest.mark, case.check.group))

    @property
    def cr(self) -> Any:
        return self.parent.session_obj

    def runtest(self) -> None:
        case, session = self.case, self.cr
        if case.skip:
            pytest.skip(case.skip)
        not_applicable = bool(case.capability) and case.registration.capability(case.capability).not_applicable
        if case.check.gpu and not session.gpu and not not_applicable:  # (its check confirms the claim, on any tier)
            pytest.skip(f"not run: {session.gpu_reason}")
        module, _, func = case.check.func.partition(":")
        fn = getattr(importlib.import_module(f"core_runner.conformance.{module}"), func)
        ctx = Ctx(session=session, check=case.check, registration=case.registration, example=case.example,
                  capability=case.capability)
        session.metrics[self.nodeid] = ctx.metrics
        fn(ctx)

    def repr_failure(self, excinfo: pytest.ExceptionInfo, style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailure):
            notes = "\n".join(getattr(excinfo.value, "__notes__", []))
            return f"{self.case.check.id}: {self.case.check.statement}\n  -> {excinfo.value}" + \
                (f"\n{notes}" if notes else "")
        here = excinfo.traceback.cut(path=__file__)  # drop pytest's own frames
        excinfo.traceback = here if len(here) else excinfo.traceback
        return super().repr_failure(excinfo, style=style or "short")

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.name
