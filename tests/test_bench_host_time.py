"""CPU smoke test of benchmarks/host_time.py: the engine's host time with the model's forward
replaced by zeros, for LLM.score and for a Gemma-3-like decode step."""
from __future__ import annotations

from benchmarks import host_time
from core_runner.engine import score


def test_score_case_reports_its_phases_and_restores_the_tokenizer_hook(single_torch_thread):
    before = score.encode_pairs
    res = host_time.score_case(num=48, repeat=1)
    assert score.encode_pairs is before
    assert res["ms_per_call"] > 0
    phases = res["phases_ms"]
    assert set(phases) == {"tokenize pairs", "process requests", "step the engine"}
    assert 0 < sum(phases.values()) <= res["ms_per_call"] * 1.01


def test_decode_case_times_pure_decode_steps(single_torch_thread):
    res = host_time.decode_case(rows=4, context=256, output_len=16)
    assert res["steps"] >= 16 and res["decode_step_host_ms_p50"] > 0
