"""The conformance suite as a product: its catalog matches its docs, every check resolves,
the pytest plugin is inert unless asked, and both entry points (pytest --pyargs and the
CLI) work."""
from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from core_runner.conformance import CHECKS
from core_runner.conformance.catalog import select

ROOT = Path(__file__).resolve().parents[1]


def test_check_ids_are_stable_and_documented():
    doc = (ROOT / "docs" / "conformance.md").read_text()
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
    for c in CHECKS:
        assert re.fullmatch(r"CR-(REG|STATE|EQ|TP|SPEC|SO|LP|BOUND)-\d\d", c.id), c.id
        line = next((ln for ln in doc.splitlines() if f"`{c.id}`" in ln and " - " in ln), None)
        assert line is not None, f"{c.id} has no line in docs/conformance.md"
        assert line.endswith(c.statement), f"docs/conformance.md states {c.id} differently:\n{line}\n{c.statement}"
    documented = set(re.findall(r"`(CR-[A-Z]+-\d\d)`", doc))
    assert documented == set(ids), f"documented but not in the catalog: {sorted(documented - set(ids))}"


def test_every_check_function_resolves():
    for c in CHECKS:
        module, _, func = c.func.partition(":")
        assert callable(getattr(importlib.import_module(f"core_runner.conformance.{module}"), func)), c.id
        assert c.scope in ("plugin", "architecture", "example", "capability"), c.id


def test_select_by_id_and_prefix():
    assert [c.id for c in select(["CR-REG-01"])] == ["CR-REG-01"]
    assert {c.id for c in select(["CR-STATE"])} == {c.id for c in CHECKS if c.group == "state"}
    with pytest.raises(ValueError, match="unknown check id"):
        select(["CR-NOPE-01"])


def test_every_engine_option_has_a_probe():
    from dataclasses import fields

    from core_runner.config import EngineConfig
    from core_runner.conformance.options import PROBES

    missing = [f.name for f in fields(EngineConfig) if f.name not in PROBES]
    assert not missing, f"EngineConfig fields without a CR-BOUND-04 probe: {missing}"


def test_pytest_plugin_is_inert_without_cr_plugin(tmp_path, capsys):
    # in-process pytest sessions load the pytest11 entry point just as the command line does
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    assert pytest.main(["-q", "-p", "no:cacheprovider", str(tmp_path / "test_plain.py")]) == 0
    out = capsys.readouterr().out
    assert "1 passed" in out and "core-runner conformance" not in out
    assert pytest.main(["-q", "-p", "no:cacheprovider", "--pyargs", "core_runner.conformance"]) != 0
    out = capsys.readouterr()
    assert "--cr-plugin" in out.out + out.err


def test_pyargs_entry_point_runs_and_writes_a_report(tmp_path, capsys):
    report = tmp_path / "report.json"
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "--pyargs", "core_runner.conformance", "--cr-plugin", "qwen3",
                      "--cr-checks", "CR-REG", "--cr-tier", "cpu", "--cr-json", str(report)])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    rep = json.loads(report.read_text())
    assert rep["outcome"] == "passed" and rep["plugin"] == "qwen3"
    assert {c["id"] for c in rep["checks"]} == {"CR-REG-01", "CR-REG-02", "CR-REG-03", "CR-REG-04", "CR-REG-05"}
    assert all(c["outcome"] == "passed" for c in rep["checks"])
    assert rep["versions"]["plugin"]["distribution"] == "core-runner-qwen3"
    assert "core-runner conformance" in out  # the summary section with the capability matrix
    assert "time per check: " in out and rep["timing_s"]["CR-REG-01"] > 0


def test_cli_parser_has_conformance():
    from core_runner.cli import build_parser, cmd_conformance

    a = build_parser().parse_args(["conformance", "qwen3", "--json", "r.json", "--tier", "cpu", "--checks", "CR-EQ"])
    assert a.func is cmd_conformance and a.plugin == "qwen3" and a.json == "r.json" and a.tier == "cpu"
