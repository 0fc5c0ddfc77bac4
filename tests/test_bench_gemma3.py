"""CPU smoke test of the gemma3 bench stage (benchmarks/gemma3_bench.py): KV held by the
sliding-window groups against the formula, decode steps timed; and the windowed roofline."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import gemma3_bench
from core_runner.bench.roofline import decode_roofline_tok_s
from core_runner.bench.shapes import shape_config


def test_gemma_3_1b_shape_has_five_local_layers_to_one_global():
    cfg = shape_config("gemma-3-1b", sliding_window=1024)
    assert cfg.num_hidden_layers == 26 and cfg.head_dim == 256 and cfg.sliding_window == 1024
    assert cfg.layer_types.count("full_attention") == 4 and cfg.layer_types[5] == "full_attention"


def test_windowed_layers_read_at_most_their_window():
    wl = [([1] * 100, 1, 0.0)]  # one decode step at context 100
    full_only = decode_roofline_tok_s(wl, 0, 10, 1.0, 8)
    assert full_only == pytest.approx(1 / 1000)
    # 10 B/token of full layers + 30 B/token of window-16 layers: 1000 + 30 x 16 bytes
    assert decode_roofline_tok_s(wl, 0, 10, 1.0, 8, windowed_kv=[(16, 30)]) == pytest.approx(1 / 1480)
    assert decode_roofline_tok_s(wl, 0, 10, 1.0, 8, windowed_kv=[(1000, 30)]) == pytest.approx(1 / 4000)


def test_gemma3_stage_reports_kv_against_the_formula(tmp_path, single_torch_thread):
    out = tmp_path / "gemma3.json"
    gemma3_bench.main(["--device", "cpu", "--dtype", "float32", "--tiny", "--num-requests", "3", "--context", "160",
                       "--output-len", "12", "--window", "32", "--root", str(tmp_path), "--profile-steps", "2",
                       "--json", str(out)])
    res = json.loads(out.read_text())
    # the profile pass: whole steps under cProfile, each running the 6 layers' attention once
    attn = [h for h in res["profile"]["host_top"] if "paged_attention_ref" in h["func"]]
    assert attn and attn[0]["calls_per_step"] == 6, res["profile"]["host_top"]
    assert res["output_tokens"] == 3 * 12 and res["decode_steps_timed"] > 0 and res["decode_tok_s"] > 0
    assert res["kv_windowed_bytes_per_token"] and res["kv_windowed_bytes_per_token"][0][0] == 32
    assert res["kv_full_bytes_per_token"] > 0
    last = [s for s in res["kv_samples"] if s["decode"]][-1]
    assert last["requests"] == 3 and max(g["sliding_window"] or 0 for g in last["blocks_per_group"]) == 32
    # block rounding only: a window of 32 spans at most 3 blocks of 16, a context of ~150 ten
    assert 1.0 <= res["kv_ratio_to_formula"] < 1.6
    assert res["kv_ratio_to_all_layers"] < 0.5  # 5 of 6 layers hold a window, not the context


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gemma3_stage_on_cuda(tmp_path):
    res = gemma3_bench.main(["--tiny", "--num-requests", "8", "--context", "512", "--output-len", "32",
                             "--window", "64", "--root", str(tmp_path)])
    assert res["ratio_to_roofline"] > 0
