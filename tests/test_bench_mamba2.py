"""CPU smoke test of the mamba2 bench stage (``core-runner bench --shape mamba2-780m``, W1)
and of the roofline's recurrent-state rule."""
from __future__ import annotations

import json

import pytest
import torch

from core_runner.bench.roofline import decode_roofline_tok_s
from core_runner.bench.shapes import config_only_checkpoint, shape_config

TINY = dict(vocab_size=512, hidden_size=32, num_heads=8, head_dim=8, state_size=16, num_hidden_layers=2,
            chunk_size=8, time_step_rank=2)


def test_mamba2_780m_shape():
    cfg = shape_config("mamba2-780m")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_heads * cfg.head_dim) == (1536, 48, 2 * 1536)
    assert cfg.architectures == ["Mamba2ForCausalLM"] and cfg.state_size == 128


def test_roofline_of_an_attention_free_model_is_weights_plus_state_traffic():
    wl = [([1] * 8, 2, 0.0)] * 4  # 4 rows, 2 decode steps each
    # per step: 100 B of weights + 4 rows x 2 (read + write) x 10 B of state = 180 B
    assert decode_roofline_tok_s(wl, 100, 0, 1.0, 4, state_bytes_per_row=10) == pytest.approx(8 / 360)


def test_mamba2_stage_cli_runs_w1_on_dummy_weights(tmp_path, single_torch_thread):
    from core_runner.cli import main

    path = config_only_checkpoint("mamba2-780m", tmp_path, **TINY)
    out = tmp_path / "mamba2.json"
    rc = main(["bench", "--model", path, "--load-format", "dummy", "--device", "cpu", "--dtype", "float32",
               "--workload", "W1", "--num-requests", "4", "--scale", "32", "--prefix-caching", "off",
               "--max-num-seqs", "4", "--json", str(out)])
    assert rc == 0
    w1 = json.loads(out.read_text())["W1"]
    assert w1["output_tokens"] == 4 * 8 and w1["output_tok_s"] > 0 and not w1["prefix_caching"]
    assert w1["settings"]["num_kv_blocks"] == 0  # attention-free: no paged KV pool


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mamba2_stage_on_cuda(tmp_path):
    from core_runner.cli import main

    path = config_only_checkpoint("mamba2-780m", tmp_path, **TINY)
    out = tmp_path / "mamba2.json"
    assert main(["bench", "--model", path, "--load-format", "dummy", "--workload", "W1", "--num-requests", "16",
                 "--scale", "8", "--prefix-caching", "off", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["W1"]["ratio_to_roofline"] > 0
