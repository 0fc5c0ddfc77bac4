"""The windowed Qwen3 checkpoint of tests/test_sliding_window.py through the Triton
kernels and attention backend (interpreter on the CPU): two KV cache groups, chunked
prefill past several windows, decode; logits against transformers."""
from __future__ import annotations

from helpers import Recorder, assert_logits_match_hf, random_prompts, run
from test_sliding_window import _ckpt, _llm

from core_runner import SamplingParams


def test_triton_windowed_groups_match_transformers(tmp_path, device):
    ckpt = _ckpt(tmp_path, "mixed", max_window_layers=2)
    eng = _llm(ckpt, device=device, kernels="triton", attention_backend="triton").engine
    assert eng.memory_report()["kv_cache_groups"] == 2
    rec = Recorder(eng)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    outs = run(eng, [(f"r{i}", p, params) for i, p in enumerate(random_prompts([41, 5], seed=4))])
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= 10
