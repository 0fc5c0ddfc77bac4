"""The shared conformance suite: one command proves a plugin's model families correct.

    core-runner conformance <entry-point-name> [--json report.json] [--tier cpu|gpu]
    pytest --pyargs core_runner.conformance --cr-plugin <entry-point-name>

Checks are generated from the plugin's registrations (architecture x example config x
declared capability): a plugin author writes no test code. The ids and one-line
statements are in ``catalog.py`` and ``docs/conformance.md``. ``run_suite`` runs the
same pytest session in-process, for a PluginManager built in code (tests register
deliberately broken plugins this way).
"""
from __future__ import annotations

from typing import Any, Sequence

from core_runner.conformance.catalog import BY_ID, CHECKS, Check

__all__ = ["BY_ID", "CHECKS", "Check", "run_suite"]


def run_suite(plugin: str | None = None, *, module: str | None = None, pm: Any = None,
              checks: Sequence[str] | None = None, json_path: str | None = None, tier: str = "auto",
              machine_examples: int = 12, model: str | None = None, dtype: str = "float32",
              pytest_args: Sequence[str] = ("-q",)) -> dict:
    """Run the suite in this process and return the report (``report["exit_code"]`` is
    pytest's). ``plugin`` names an entry point, or with ``pm`` the name the plugin was
    registered under in that PluginManager; ``module`` registers a module directly.
    ``model`` (a checkpoint directory) runs the equivalence checks on it, the engine in
    ``dtype``."""
    import pytest

    from core_runner.conformance.session import ConformanceSession

    session = ConformanceSession(plugin, module=module, pm=pm, checks=list(checks) if checks else None,
                                 json_path=json_path, tier=tier, machine_examples=machine_examples,
                                 model=model, dtype=dtype)
    # no:unraisableexception: its cleanup runs five full gc.collect() passes over the caller's whole
    # heap (about 2 s a run inside a test session); the caller's own hook still sees them
    rc = pytest.main(["--pyargs", "core_runner.conformance", "-p", "no:cacheprovider", "-p", "no:unraisableexception",
                      *pytest_args], plugins=[session])
    report = session.report or {"outcome": "failed", "checks": [], "failing": [f"pytest exited {int(rc)}"]}
    report["exit_code"] = int(rc)
    return report
