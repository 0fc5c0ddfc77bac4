"""The pytest11 entry point of the conformance suite.

Inert unless ``--cr-plugin`` or ``--cr-module`` is given: it only adds its options, and
imports nothing beyond pytest until a suite run is asked for. With the option, it
registers a ``ConformanceSession`` that collects the suite's checks from
``core_runner/conformance/suite.py`` (the file pytest reaches through
``pytest --pyargs core_runner.conformance``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

SUITE_FILE = Path(__file__).with_name("suite.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("core-runner conformance", "core-runner plugin conformance suite")
    g.addoption("--cr-plugin", default=None, metavar="NAME",
                help="run the conformance suite against the core_runner entry point NAME")
    g.addoption("--cr-module", default=None, metavar="MODULE",
                help="register MODULE (a module with hookimpls) directly instead of an entry point")
    g.addoption("--cr-json", default=None, metavar="PATH", help="write the conformance report to PATH")
    g.addoption("--cr-tier", default="auto", choices=["auto", "cpu", "gpu"],
                help="cpu: skip GPU checks; gpu: require a GPU and run them; auto: run them when CUDA is present")
    g.addoption("--cr-checks", default=None, metavar="IDS",
                help="comma-separated check ids or prefixes to run (default: all), e.g. CR-STATE,CR-EQ-01")
    g.addoption("--cr-model", default=None, metavar="PATH",
                help="run the equivalence checks on this checkpoint directory (its reference loaded by transformers)")
    g.addoption("--cr-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                help="engine dtype for --cr-model (the reference stays float32); tolerances per dtype in the docs")
    g.addoption("--cr-machine-examples", default=12, type=int, metavar="N",
                help="Hypothesis examples for the random lifecycle state machine (CR-STATE-06)")


def _session(config: pytest.Config) -> object | None:
    for p in config.pluginmanager.get_plugins():
        if getattr(p, "_cr_session", False):
            return p
    return None


def pytest_configure(config: pytest.Config) -> None:
    session = _session(config)
    if session is None and (config.getoption("cr_plugin") or config.getoption("cr_module")):
        from core_runner.conformance.session import ConformanceSession

        session = ConformanceSession.from_options(config)
        config.pluginmanager.register(session, "core_runner_conformance_session")
    if session is not None:
        session.configure(config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path != SUITE_FILE:
        return None
    session = _session(parent.config)
    if session is None:
        raise pytest.UsageError("the core-runner conformance suite needs --cr-plugin <entry-point-name> "
                                "(see `core-runner plugins`) or --cr-module <module>")
    return session.collector(parent, file_path)
