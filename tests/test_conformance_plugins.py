"""CI: the conformance suite against every installed plugin (the built-in ones and
examples/plugin_template), each through the command a plugin author runs:
``core-runner conformance <name> --tier cpu --json report.json``.

The runs are separate processes. They start once collection is over if any test of this
module is selected (tests/conftest.py calls ``start_runs``), one at a time in the
background, so they overlap the rest of the test session on a second core;
once a test here waits for its result, two run at a time (each uses one torch thread).
Any still running when the interpreter exits are killed."""
from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import core_runner
from core_runner.conformance.harness import LOGIT_ATOL

PLUGINS = sorted(ep.name for ep in entry_points(group="core_runner"))
ALLOWED_NOT_RUN = ("not run: no GPU", "not run: tier cpu", "not run: this suite version checks task 'generate'",
                   "not run: not applicable")
TIMEOUT_S = 1500


class _Runs:
    """Runs ``core-runner conformance`` for each plugin, ``limit`` processes at a time."""

    def __init__(self, names: list[str]) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="cr-conformance-ci-")
        self.pending = list(names)
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: dict[str, float] = {}
        self.limit = 1
        self.cond = threading.Condition()
        atexit.register(self.stop)
        threading.Thread(target=self._loop, daemon=True).start()

    def _start(self, name: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("CORE_RUNNER_PLUGINS", "CORE_RUNNER_STRICT")}
        with open(Path(self.dir.name) / f"{name}.log", "w") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "core_runner.cli", "conformance", name, "--tier", "cpu",
                 "--json", str(Path(self.dir.name) / f"{name}.json")],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        self.started[name] = time.monotonic()

    def _loop(self) -> None:
        while True:
            with self.cond:
                running = [n for n, p in self.procs.items() if p.poll() is None]
                while self.pending and len(running) < self.limit:
                    name = self.pending.pop(0)
                    self._start(name)
                    running.append(name)
                self.cond.notify_all()
                if not self.pending and not running:
                    return
                self.cond.wait(timeout=0.5)

    def result(self, name: str) -> tuple[int | None, str, dict | None]:
        with self.cond:
            self.limit = 2
            if name in self.pending:  # the one a test waits for goes first
                self.pending.remove(name)
                self.pending.insert(0, name)
            self.cond.notify_all()
            deadline = time.monotonic() + TIMEOUT_S
            while name not in self.procs or self.procs[name].poll() is None:
                if time.monotonic() > deadline:
                    if name in self.procs:
                        self.procs[name].kill()
                    break
                self.cond.wait(timeout=0.5)
        out_dir = Path(self.dir.name)
        log = (out_dir / f"{name}.log").read_text() if (out_dir / f"{name}.log").is_file() else ""
        report = out_dir / f"{name}.json"
        data = json.loads(report.read_text()) if report.is_file() else None
        return self.procs[name].returncode if name in self.procs else None, log[-8000:], data

    def stop(self) -> None:
        with self.cond:
            self.pending.clear()
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.dir.cleanup()


RUNS: _Runs | None = None


def start_runs() -> _Runs:
    global RUNS
    if RUNS is None:
        RUNS = _Runs(PLUGINS)
    return RUNS


def test_template_and_builtin_plugins_are_installed():
    missing = {"llama_template", "qwen3"} - set(PLUGINS)
    assert not missing, f"plugins {sorted(missing)} are not installed: pip install -r requirements-dev.txt"


@pytest.mark.parametrize("name", PLUGINS)
def test_plugin_passes_the_conformance_suite(name):
    rc, output, report = start_runs().result(name)
    assert report is not None, f"core-runner conformance {name} wrote no report (exit {rc}):\n{output}"
    assert rc == 0 and report["outcome"] == "passed", \
        f"core-runner conformance {name} failed: {report['failing']}\n{output}"
    versions = report["versions"]
    assert versions["suite"] == core_runner.__version__ and versions["core"]
    assert versions["plugin"]["entry_point"] == name and versions["plugin"]["version"]
    assert versions["torch"] and versions["transformers"]
    assert report["checks"] and report["architectures"]
    for c in report["checks"]:
        assert c["outcome"] == "passed" or c["outcome"].startswith(ALLOWED_NOT_RUN), (c["name"], c["outcome"])
    generate_archs = {c["architecture"] for c in report["checks"] if c["id"] == "CR-EQ-01" and c["outcome"] == "passed"}
    want = {"supported": "supported", "unsupported": "unsupported (refused at config time)",
            "xfail": "xfail (fails as declared)"}
    for arch, caps in report["capabilities"].items():
        for cap, row in caps.items():
            # the capabilities the CPU can check: declared == observed
            if arch in generate_archs and cap in ("chunked_prefill", "async_scheduling"):
                assert row["observed"] == want[row["declared"]], (arch, cap, row)


def check_qwen3_speculation(report: dict) -> None:
    """CR-SPEC-01 / 02 on every Qwen3 and Qwen3-MoE example, from the plugin's full run: n-gram
    proposals accepted and rejected, under the default budget and chunks of 8, every logits row
    within the tolerance, and a reused row's lookups matching."""
    checks = [c for c in report["checks"] if c["id"].startswith("CR-SPEC")]
    assert sorted(c["name"] for c in checks if c["id"] == "CR-SPEC-01") == sorted(
        c["name"].replace("CR-SPEC-02", "CR-SPEC-01") for c in checks if c["id"] == "CR-SPEC-02")
    assert len(checks) == 18  # 4 Qwen3 (one fp8) and 2 Qwen3-MoE examples, three checks each
    # CR-SPEC-03 (the family's own draft) is not applicable: Qwen3 registers none
    assert all(c["outcome"].startswith("not run: not applicable") for c in checks if c["id"] == "CR-SPEC-03")
    checks = [c for c in checks if c["id"] != "CR-SPEC-03"]
    for c in checks:
        assert c["outcome"] == "passed", (c["name"], c["outcome"])
        assert 0 <= c["max_logit_error"] <= LOGIT_ATOL
    for c in (c for c in checks if c["id"] == "CR-SPEC-01"):
        notes = " ".join(c["notes"])
        assert "default budget: accepted/proposed loop " in notes and "max_num_batched_tokens=8: " in notes, notes
        accepted, proposed = map(int, re.search(r"(\d+) of (\d+) proposed tokens accepted", notes).groups())
        assert 0 < accepted < proposed
    for c in (c for c in checks if c["id"] == "CR-SPEC-02"):
        # Zg's lookups match on every example; the cold seeded Zs's on most
        assert re.search(r"then Z Zg \d+/[1-9]\d*, Zs \d+/\d+ in row \d+", " ".join(c["notes"])), c["notes"]
    assert {r["speculative_decoding"]["observed"] for r in report["capabilities"].values()} == {"supported"}


@pytest.mark.skipif("qwen3" not in PLUGINS, reason="pip install -e plugins/qwen3 (requirements-dev)")
def test_qwen3_speculation_is_checked_on_every_example():
    """Read from the background run rather than run again here (its CR-SPEC checks take ~13 s)."""
    _, output, report = start_runs().result("qwen3")
    assert report is not None, output
    check_qwen3_speculation(report)


def check_pooling_classifiers(report: dict) -> None:
    """CR-EQ-15 on every classifier example of the pooling plugin, from its full run."""
    cases = {c["name"]: c for c in report["checks"] if c["id"] == "CR-EQ-15"}
    # 3 BERT, 2 Qwen3, 2 XLM-R, 2 Llama, 3 ModernBERT classifier examples
    assert len(cases) == 12, sorted(cases)
    for name, c in cases.items():
        assert c["outcome"] == "passed", (name, c["message"])
    notes = " ".join(cases["CR-EQ-15[Qwen3ForSequenceClassification:tiny-qwen3-cls]"]["notes"])
    assert "chunk boundaries inside prompts" in notes and "rows freed by longer ones" in notes, notes
    assert "sigmoid over 6 labels" in " ".join(cases["CR-EQ-15[BertForSequenceClassification:toxic-bert-shape]"]
                                                ["notes"])


def check_pooling_scores(report: dict) -> None:
    """CR-EQ-17 on every example serving score (cross-encoders) or embed (cosine), from the
    pooling plugin's full run."""
    from core_runner.plugins import load_plugins

    cases = {c["name"]: c for c in report["checks"] if c["id"] == "CR-EQ-17"}
    scoring = load_plugins(["pooling"]).registry.by_plugin("pooling")
    expected = {f"CR-EQ-17[{r.architecture}:{e['name']}]" for r in scoring
                if {"score", "embed"} & set(r.tasks) for e in r.examples}
    assert len(expected) >= 15 and set(cases) == expected, sorted(set(cases) ^ expected)
    for name, c in cases.items():
        assert c["outcome"] == "passed", (name, c["message"])
    notes = {n: " ".join(c["notes"]) for n, c in cases.items()}
    assert "chunk boundaries" in notes["CR-EQ-17[Qwen3ForSequenceClassification:qwen3-reranker-0.6b-seq-cls-shape]"]
    assert "cross-encoder" in notes["CR-EQ-17[BertForSequenceClassification:ms-marco-minilm-l6-v2-shape]"]
    assert "cosine" in notes["CR-EQ-17[BertModel:tiny-bert]"]
    assert "refuses it by name" in notes["CR-EQ-17[BertForSequenceClassification:toxic-bert-shape]"]
    assert report["tasks"]["BertForSequenceClassification"]["score"]["observed"] == "supported"
    assert any(n.startswith("CR-EQ-17") for n in report["tasks"]["BertModel"]["embed"]["checks"])


@pytest.mark.skipif("pooling" not in PLUGINS, reason="pip install -e plugins/pooling (requirements-dev)")
def test_pooling_classifiers_and_scores_are_checked_on_every_example():
    """Read from the background run rather than run again here (CR-EQ-15 and CR-EQ-17 take ~12 s)."""
    _, output, report = start_runs().result("pooling")
    assert report is not None, output
    check_pooling_classifiers(report)
    check_pooling_scores(report)


def _control_cases(report: dict, arch: str, examples: tuple[str, ...], cid: str) -> list[dict]:
    named = [c for c in report["checks"] if c["id"] == cid and c["name"].startswith(f"{cid}[{arch}:")]
    per_example = [c for c in named if any(c["name"] == f"{cid}[{arch}:{ex}]" for ex in examples)]
    return per_example or named  # a per-capability check (CR-EQ-18) is named by its capability


def check_corpus_control(report: dict, controls: dict) -> None:
    """The plugin passed, on its corpus examples, every check its family's planted bugs run."""
    for arch, (examples, checks) in controls.items():
        for cid in checks:
            cases = _control_cases(report, arch, examples, cid)
            assert cases, f"{cid} did not run on {arch} {examples}"
            for c in cases:
                assert c["outcome"] == "passed" or c["outcome"].startswith(ALLOWED_NOT_RUN), (c["name"], c["outcome"])
            assert any(c["outcome"] == "passed" for c in cases), [(c["name"], c["outcome"]) for c in cases]


@pytest.mark.parametrize("name", [n for n in ("deepseek", "granite_hybrid", "llama_template", "pooling", "qwen3")
                                  if n in PLUGINS])
def test_corpus_control_passes_its_family_bugs_checks(name):
    """The planted-bug corpus's controls (tests/test_conformance_corpus.py), from the full runs."""
    from conformance_fixtures.corpus import CONTROLS

    _, output, report = start_runs().result(name)
    assert report is not None, output
    check_corpus_control(report, CONTROLS[name])
