"""CR-SO-01 (core_runner/conformance/checks_grammar.py) and CR-LP-01
(checks_processors.py) on the Qwen3 plugin: grammars hold and processors are batch
invariant. Planted bugs: a model whose logits mix rows of the batch
(tests/conformance_fixtures/batch_mixed_logits.py) fails CR-SO-01 at a request without a
grammar; a processor installed by entry point that keeps state by stale batch index
(conformance_fixtures/stale_processor.py) fails CR-LP-01."""
from __future__ import annotations

import importlib
import sys

import pytest

from core_runner.conformance import run_suite
from core_runner.logits_processor import ENTRY_POINT_GROUP, installed_processors
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")
pytest.importorskip("xgrammar", reason="structured outputs need xgrammar")


def _qwen3_tiny() -> PluginManager:
    pm = PluginManager()
    pm.register_module("good_qwen3", importlib.import_module("conformance_fixtures.good_qwen3"))
    return pm


def test_grammars_hold_on_qwen3_and_a_batch_mixing_model_fails_cr_so_01():
    (c,) = run_suite("good_qwen3", pm=_qwen3_tiny(), checks=["CR-SO-01"], tier="cpu")["checks"]
    assert c["outcome"] == "passed", c["message"]
    notes = " ".join(c["notes"])
    assert "json complete" in notes and "regex complete" in notes and "choice complete" in notes, notes
    pm = PluginManager()
    pm.register_module("mixed", importlib.import_module("conformance_fixtures.batch_mixed_logits"))
    (c,) = run_suite("mixed", pm=pm, checks=["CR-SO-01"], tier="cpu")["checks"]
    assert c["outcome"] == "failed", c
    assert "in a batch with grammar rows vs alone" in c["message"], c["message"]


def test_processors_batch_invariant_and_a_stale_index_processor_fails_cr_lp_01(tmp_path):
    (c,) = run_suite("good_qwen3", pm=_qwen3_tiny(), checks=["CR-LP-01"], tier="cpu")["checks"]
    assert c["outcome"] == "passed", c["message"]
    assert "equal the edited reference" in " ".join(c["notes"]), c["notes"]
    dist = tmp_path / "cr_stale_lp-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cr-stale-lp\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nstale = conformance_fixtures.stale_processor:StaleIndexProcessor\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert [p.__name__ for p in installed_processors()] == ["StaleIndexProcessor"]
        (c,) = run_suite("good_qwen3", pm=_qwen3_tiny(), checks=["CR-LP-01"], tier="cpu")["checks"]
    finally:
        sys.path.remove(str(tmp_path))
    assert c["outcome"] == "failed", c
    assert "vs alone" in c["message"] and "without processor arguments" in c["message"], c["message"]
