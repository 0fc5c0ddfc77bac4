"""CPU smoke test of the structured-outputs bench stage (benchmarks/so_bench.py): W2 with a
JSON schema vs without on one engine, the grammar-finished outputs parse."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("xgrammar")
from benchmarks import so_bench  # noqa: E402


def test_so_stage_runs_and_grammar_outputs_parse(tmp_path, single_torch_thread):
    out = tmp_path / "so.json"
    so_bench.main(["--device", "cpu", "--dtype", "float32", "--tiny", "--num-requests", "6", "--scale", "8",
                   "--root", str(tmp_path), "--json", str(out)])
    res = json.loads(out.read_text())
    plain, grammar = res["plain"], res["json_schema"]
    assert plain["finish_reasons"] == {"length": 6} and plain["output_tokens"] == plain["requested_tokens"]
    assert sum(grammar["finish_reasons"].values()) == 6 and set(grammar["finish_reasons"]) <= {"stop", "length"}
    assert 0 < grammar["output_tokens"] <= grammar["requested_tokens"]
    assert grammar["grammar_finished"] == grammar["finish_reasons"].get("stop", 0)
    assert grammar["parsed"] == grammar["grammar_finished"]  # every output the grammar closed is the schema's JSON
    assert grammar["sample_text"].lstrip().startswith("{")
    for key in ("tpot_p50_ratio", "tpot_mean_ratio", "tok_s_ratio"):
        assert res[key] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_so_stage_on_cuda(tmp_path):
    res = so_bench.main(["--tiny", "--num-requests", "16", "--scale", "8", "--root", str(tmp_path)])
    assert res["json_schema"]["parsed"] == res["json_schema"]["grammar_finished"]
