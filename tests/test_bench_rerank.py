"""CPU smoke test of the rerank bench stage (benchmarks/rerank_bench.py): LLM.score on a
random cross-encoder of the ms-marco-MiniLM-L-6-v2 shape vs transformers, same scores."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import rerank_bench


def test_rerank_stage_scores_match_transformers(tmp_path, single_torch_thread):
    out = tmp_path / "rerank.json"
    rerank_bench.main(["--device", "cpu", "--dtype", "float32", "--tiny", "--num-pairs", "24", "--batch", "8",
                       "--max-num-batched-tokens", "default", "512", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["num_pairs"] == 24 and res["engine"]["pairs_per_s"] > 0 and res["transformers"]["pairs_per_s"] > 0
    assert res["ratio"] == pytest.approx(res["engine"]["pairs_per_s"] / res["transformers"]["pairs_per_s"])
    assert res["max_abs_score_diff"] < 1e-4  # the same model, tokenizer and pair template both ways
    assert res["engine"]["mean_pair_tokens"] > 20
    by = res["engine_by_tokens"]
    # "default": the engine's own budget, reported as used (the CPU's 2,048: pooling keeps it there)
    assert res["engine"]["engine_default_tokens"] and res["engine"]["max_num_batched_tokens"] == 2048
    assert sorted(by) == ["2048", "512"] and by["2048"]["pairs_per_s"] == res["engine"]["pairs_per_s"]
    assert not by["512"]["engine_default_tokens"]
    assert by["512"]["max_abs_score_diff"] < 1e-4  # smaller steps, same scores


def test_pairs_are_short_queries_and_longer_passages():
    queries, passages = rerank_bench.make_pairs(1024)
    assert len(queries) == len(passages) == 1024
    assert all(len(p.split()) <= 60 for p in passages)
    assert sum(len(p) for p in passages) > 3 * sum(len(q) for q in queries)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rerank_stage_on_cuda():
    res = rerank_bench.main(["--tiny", "--num-pairs", "64", "--batch", "32"])
    assert res["max_abs_score_diff"] < 2e-2
