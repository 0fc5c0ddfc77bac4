"""CR-EQ-10 / CR-EQ-11 (core_runner/conformance/checks_pooling.py) under chunked prefill,
mixed batches and reused rows, always against the reference: poolers that lose what
earlier chunks carried (tests/conformance_fixtures/chunked_pooling_state.py) pass on
whole prompts (CR-EQ-10) and fail CR-EQ-11 naming the pooling type and the chunks; the
pooling plugin as it ships passes both, with chunk ends inside its prompts and rows
reused after longer requests."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_pooling", reason="pip install -e plugins/pooling (requirements-dev)")


def _suite(name: str, module: str) -> dict[str, list[dict]]:
    pm = PluginManager()
    pm.register_module(name, importlib.import_module(module))
    report = run_suite(name, pm=pm, checks=["CR-EQ-10", "CR-EQ-11"], tier="cpu")
    by_id: dict[str, list[dict]] = {}
    for c in report["checks"]:
        by_id.setdefault(c["id"], []).append(c)
    return by_id


@pytest.mark.parametrize("fixture, kind", [("chunked_mean_pooling", "mean"), ("chunked_cls_pooling", "cls")])
def test_a_pooler_that_forgets_earlier_chunks_fails_cr_eq_11(fixture, kind):
    checks = _suite(fixture, f"conformance_fixtures.{fixture}")
    (eq10,), (eq11,) = checks["CR-EQ-10"], checks["CR-EQ-11"]
    assert eq10["outcome"] == "passed", eq10["message"]  # whole prompts hide it
    assert eq11["outcome"] == "failed", eq11
    msg = eq11["message"]
    assert f"pooling {kind} " in msg and "chunk" in msg and "differs from the reference" in msg, msg
    assert "run in steps of" in msg, msg  # the failing prompt really was split


def test_the_pooling_plugin_passes_with_chunk_ends_inside_prompts_and_reused_rows():
    checks = _suite("pooling", "core_runner_pooling.hooks")
    for c in checks["CR-EQ-10"] + checks["CR-EQ-11"]:
        assert c["outcome"] == "passed", (c["name"], c["message"])
    for c in checks["CR-EQ-10"]:
        assert "['mean', 'cls', 'last']" in " ".join(c["notes"]), c["notes"]
    for c in checks["CR-EQ-11"]:
        notes = " ".join(c["notes"])
        assert "requests in rows freed by longer ones" in notes, notes
        if c["architecture"] == "Qwen3Model":  # causal: chunked prefill supported
            assert "chunk boundaries inside prompts" in notes and "(chunks of <= 7)" in notes, notes
        else:  # BERT attends bidirectionally: whole prompts only
            assert "the chunk part was not run" in notes, notes
