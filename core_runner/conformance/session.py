"""One run of the suite against one plugin: loading it, generating the cases from its
registrations, shared caches (reference checkpoints, the fresh-process probe), and the
results that become the JSON report."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from core_runner.conformance import catalog
from core_runner.conformance.harness import Example, Reference, examples_of
from core_runner.conformance.suite import Case, SuiteFile
from core_runner.plugins import PluginManager
from core_runner.registry import CAPABILITIES, Capability, Registration

# the checks a checkpoint run (--model) makes by default: those comparing with the reference
CHECKPOINT_CHECKS = ("CR-EQ-01", "CR-EQ-02", "CR-EQ-03", "CR-EQ-04")


class ConformanceSession:
    _cr_session = True  # how plugin.py finds a session however it was registered

    def __init__(self, plugin_name: str | None = None, *, module: str | None = None, pm: PluginManager | None = None,
                 checks: list[str] | None = None, json_path: str | None = None, tier: str = "auto",
                 machine_examples: int = 12, model: str | None = None, dtype: str = "float32") -> None:
        if not plugin_name and not module:
            raise ValueError("the conformance suite needs a plugin entry-point name or a module")
        from core_runner.conformance.tolerance import Tolerance

        self.tolerance = Tolerance(dtype)  # validates dtype
        if dtype != "float32" and not model:
            raise ValueError(f"dtype {dtype!r} needs a checkpoint (--model PATH): the tiny examples run in float32")
        self.model = model
        self.model_architecture: str | None = None
        if model and not checks:
            checks = list(CHECKPOINT_CHECKS)
        self.plugin_name = plugin_name or module.rsplit(".", 1)[-1]
        self.module = module
        self.from_module = module is not None or pm is not None
        self.given_pm = pm
        self.check_patterns = checks
        self.json_path = json_path
        self.tier = tier
        self.machine_examples = machine_examples
        self.pm: PluginManager | None = None
        self.plugin_obj: Any = None
        self.load_error: str | None = None
        self.registrations: list[Registration] = []
        self.metrics: dict[str, dict] = {}
        self.records: dict[str, dict] = {}
        self.report: dict | None = None
        self._refs: dict[tuple[str, str], Reference] = {}
        self._forcing: dict[tuple[str, str], PluginManager] = {}
        self._probe: dict | None = None
        self._cases: list[Case] | None = None
        self._tmp: str | None = None
        self._threads: int | None = None
        self._t0 = time.perf_counter()
        self.gpu, self.gpu_reason = False, "no GPU"

    @classmethod
    def from_options(cls, config: pytest.Config) -> "ConformanceSession":
        checks = config.getoption("cr_checks")
        return cls(config.getoption("cr_plugin"), module=config.getoption("cr_module"),
                   checks=[c.strip() for c in checks.split(",") if c.strip()] if checks else None,
                   json_path=config.getoption("cr_json"), tier=config.getoption("cr_tier"),
                   machine_examples=config.getoption("cr_machine_examples"), model=config.getoption("cr_model"),
                   dtype=config.getoption("cr_dtype"))

    # ---- setup --------------------------------------------------------------------
    def configure(self, config: pytest.Config) -> None:
        import torch

        for group in ("registration", "state", "equivalence", "bounds"):
            config.addinivalue_line("markers", f"{group}: core-runner conformance {group} checks")
        if self.tier == "cpu":
            self.gpu, self.gpu_reason = False, "tier cpu"
        elif torch.cuda.is_available():
            self.gpu, self.gpu_reason = True, ""
        elif self.tier == "gpu":
            raise pytest.UsageError("--cr-tier gpu needs a CUDA device, and torch sees none")
        self.selected = catalog.select(self.check_patterns)
        self._load()

    def _load(self) -> None:
        try:
            if self.given_pm is not None:
                self.pm = self.given_pm
                if self.plugin_name not in self.pm.plugins:
                    raise ValueError(f"plugin {self.plugin_name!r} is not registered in the given PluginManager "
                                     f"(it has {sorted(self.pm.plugins)})")
            else:
                self.pm = PluginManager()
                if self.module:
                    import importlib

                    self.pm.register_module(self.plugin_name, importlib.import_module(self.module))
                else:
                    self.pm.load_entry_points([self.plugin_name])
            self.plugin_obj = self.pm.pm.get_plugin(self.plugin_name)
            self.registrations = self.pm.registry.by_plugin(self.plugin_name)
            if not self.registrations:
                raise ValueError(f"plugin {self.plugin_name!r} registered no architecture of its own")
            if self.model:
                from core_runner.conformance.checkpoint import checkpoint_architecture

                self.model_architecture = checkpoint_architecture(self.model, self.registrations)
        except Exception as e:  # becomes the failure of CR-REG-01, never a skip
            self.load_error = f"{type(e).__name__}: {e}"
            self.registrations = []

    def collector(self, parent: pytest.Collector, path: Path) -> SuiteFile:
        f = SuiteFile.from_parent(parent, path=path)
        f.session_obj = self
        return f

    @property
    def generated_cases(self) -> list[Case]:
        """The cases generated so far: none until collection asked for them."""
        return self._cases or []

    def cases(self) -> list[Case]:
        if self._cases is None:
            self._cases = list(self._generate())
        return self._cases

    def _generate(self) -> Any:
        for check in self.selected:
            if check.scope == "plugin":
                yield Case(check, self.plugin_name)
                continue
            for reg in self.registrations:
                try:
                    examples = examples_of(reg)
                except ValueError:
                    examples = []  # CR-REG-05 reports it
                if self.model:  # the checkpoint is the one example, of its own architecture
                    if reg.architecture != self.model_architecture:
                        continue
                    examples = [Example("checkpoint", {})]
                skip = None
                if not check.applies_to(reg.tasks):
                    if check.task != "generate":
                        continue  # a check of another task: not generated at all
                    skip = f"not run: this suite version checks task 'generate', {reg.architecture} serves {reg.tasks}"
                if check.scope == "architecture":
                    if check.id == "CR-REG-05" or examples:
                        yield Case(check, reg.architecture, reg, examples[0] if examples else None, skip=skip)
                elif check.scope == "example":
                    state = reg.capability(check.capability).state if check.capability else "supported"
                    if state == "unsupported":
                        continue
                    for ex in examples:
                        yield Case(check, f"{reg.architecture}:{ex.name}", reg, ex, check.capability, skip=skip,
                                   xfail=reg.capability(check.capability).reason if state == "xfail" else None)
                elif check.scope == "capability" and examples:
                    if check.capability is None:
                        caps = [c for c in CAPABILITIES if reg.capability(c).state != "supported"]
                    elif check.capability.endswith("*"):
                        caps = [c for c in CAPABILITIES if c.startswith(check.capability[:-1])]
                    else:
                        caps = [check.capability]
                    for cap in caps:
                        state = reg.capability(cap)
                        if check.capability is not None and state.state == "unsupported":
                            continue
                        yield Case(check, f"{reg.architecture}:{cap}", reg, examples[0], cap, skip=skip,
                                   xfail=state.reason if check.capability and state.state == "xfail" else None)

    # ---- shared resources ---------------------------------------------------------
    def reference(self, reg: Registration, example: Example) -> Reference:
        key = (reg.architecture, example.name)
        if key not in self._refs:
            if self.model:
                from core_runner.conformance.checkpoint import CheckpointReference

                self._refs[key] = CheckpointReference(reg, Path(self.model))
            else:
                self._refs[key] = Reference(reg, example, self.scratch_dir())
        return self._refs[key]

    def scratch_dir(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="core-runner-conformance-")
        return Path(self._tmp)

    def scratch_reference(self, reg: Registration, example: Example, like: Reference | None = None) -> Reference:
        """A reference for a derived example (CR-EQ-12/13), not kept: variants are many.
        ``like``: the reference whose tensors it shares where names and shapes agree."""
        return Reference(reg, example, self.scratch_dir(), like=like)

    def first_example(self, reg: Registration) -> Example:
        if self.model:
            return Example("checkpoint", {})
        return examples_of(reg)[0]

    def forcing_pm(self, reg: Registration, capability: str) -> PluginManager:
        """A plugin manager whose copy of ``reg`` declares ``capability`` supported, so the
        oracle lets an xfail capability run and the check can show it still fails."""
        key = (reg.architecture, capability)
        if key not in self._forcing:
            pm = PluginManager()
            caps = {**reg.capabilities, capability: Capability("supported")}
            # the registration itself, every other field as declared
            pm.registry.restore(({reg.architecture: dataclasses.replace(reg, capabilities=caps)}, {}))
            self._forcing[key] = pm
        return self._forcing[key]

    def fresh_process_probe(self) -> dict:
        if self._probe is not None:
            return self._probe
        cmd = [sys.executable, "-m", "core_runner.conformance.probe"]
        if not self.from_module:
            cmd += ["--entry-point", self.plugin_name]
        else:
            mod = self.module or (self.plugin_obj.__name__ if isinstance(self.plugin_obj, type(sys)) else None)
            if mod is None:
                self._probe = {"not_run": "the plugin object was registered directly and is not an importable module"}
                return self._probe
            cmd += ["--module", mod, "--name", self.plugin_name]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.pop("CORE_RUNNER_PLUGINS", None)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode or not lines:
            self._probe = {"ok": False, "error": f"probe process exited {proc.returncode}: {proc.stderr[-2000:]}",
                           "architectures": [], "registrations": {}, "new_modules": [], "cuda_initialized": False,
                           "cuda_init_calls": 0, "modules_built": 0, "module_types": []}
        else:
            self._probe = json.loads(lines[-1])
        return self._probe

    # ---- pytest hooks -------------------------------------------------------------
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        import torch

        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny models: one thread is faster and steadier on a shared CPU

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        item_case = next((c for c in self.cases() if report.nodeid.endswith(f"::{c.name}")), None)
        if item_case is None:
            return
        rec = self.records.get(report.nodeid)
        if rec is None:
            rec = self.records[report.nodeid] = _record(item_case)
        rec["duration_s"] = round(rec["duration_s"] + report.duration, 3)
        outcome = _outcome(report)
        if outcome is None:
            return
        if rec["outcome"] in (None, "passed") or outcome in ("failed", "error"):
            rec["outcome"] = outcome
            if outcome in ("failed", "error", "xpassed (strict xfail: fails the run)"):
                rec["message"] = _failure_message(report)
        m = self.metrics.get(report.nodeid)
        if m is not None:
            rec["max_logit_error"] = m["max_logit_error"]
            rec["first_divergent_token"] = m["first_divergent_token"]
            rec["notes"] = list(m["notes"])
            for key in ("options", "variants"):
                if key in m:
                    rec[key] = m[key]

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from core_runner.conformance.report import build_report

        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)
        self.report = build_report(self, time.perf_counter() - self._t0)
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(self.report, indent=2, default=str))
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from core_runner.conformance.report import summary_lines

        if self.report is None:
            return
        terminalreporter.section("core-runner conformance")
        for line in summary_lines(self.report):
            terminalreporter.write_line(line)
        if self.json_path:
            terminalreporter.write_line(f"report: {self.json_path}")


def _failure_message(report: pytest.TestReport) -> str:
    """What the check said first (the exception's own message: captured logs of a step
    fault must not push it out), then the end of the failure text, plus Hypothesis'
    minimal failing example wherever it sits (a long traceback can push it out of the tail)."""
    text = report.longreprtext
    for _, content in report.sections:
        text += "\n" + content
    # a check's own failure (CheckFailure) is reported as a plain string by SuiteItem.repr_failure
    own = report.longrepr if isinstance(report.longrepr, str) else None
    crash = own or getattr(getattr(report.longrepr, "reprcrash", None), "message", None) or ""
    crash = crash[:4000]
    # the header Hypothesis prints before the minimal steps (it changed wording across versions)
    i = max(text.find("Falsifying example"), text.find("Failing test case"))
    if i < 0 or i >= len(text) - 3000:
        return crash + "\n...\n" + text[-1500:] if crash else text[-3000:]
    return (crash + "\n...\n" if crash else "") + text[i: i + 2500] + "\n...\n" + text[-1500:]


def _record(case: Case) -> dict:
    reg = case.registration
    return {
        "id": case.check.id, "name": case.name, "statement": case.check.statement, "group": case.check.group,
        "architecture": reg.architecture if reg else None,
        "example": case.example.name if case.example and case.check.scope == "example" else None,
        "capability": case.capability,
        "declared": reg.capability(case.capability).state if reg and case.capability else None,
        "outcome": None, "message": None, "duration_s": 0.0, "max_logit_error": None,
        "first_divergent_token": None, "notes": [],
    }


def _outcome(report: pytest.TestReport) -> str | None:
    if report.when == "call" or report.outcome != "passed":
        if hasattr(report, "wasxfail"):
            return "xfailed" if report.skipped else "xpassed (strict xfail: fails the run)"
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            reason = reason.removeprefix("Skipped: ")
            return reason if reason.startswith("not run") else f"not run: {reason}"
        if report.failed:
            if report.when != "call":
                return "error"
            return "xpassed (strict xfail: fails the run)" if "XPASS(strict)" in report.longreprtext else "failed"
        return "passed"
    return None
