"""CPU smoke test of the w3granite bench stage (W3 with the prefix cache on and off on the
granite-4.0-h hybrid shape, through ``core-runner bench``), and that every gpu_check.sh
stage is documented in the script's header."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
TINY = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
            num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
            mamba_chunk_size=16, shared_intermediate_size=128, intermediate_size=128)


def _granite_checkpoint(path: Path) -> str:
    pytest.importorskip("core_runner_granite_hybrid")
    from core_runner_granite_hybrid.bench import granite_4_0_h_350m_config

    cfg = granite_4_0_h_350m_config(**TINY)
    cfg.dtype = "bfloat16"
    cfg.save_pretrained(path)
    return str(path)


def test_w3_on_the_granite_hybrid_with_the_cache_on_and_off(tmp_path, single_torch_thread):
    from core_runner.cli import main

    path = _granite_checkpoint(tmp_path / "granite")
    out = tmp_path / "w3granite.json"
    rc = main(["bench", "--model", path, "--load-format", "dummy", "--device", "cpu", "--dtype", "float32",
               "--workload", "W3", "--num-requests", "6", "--scale", "16", "--prefix-caching", "on", "off",
               "--max-model-len", "256", "--max-num-seqs", "8", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    on, off, cmp = res["W3_prefix_caching_on"], res["W3_prefix_caching_off"], res["W3_prefix_caching_on_vs_off"]
    assert on["prefix_caching"] and not off["prefix_caching"]
    assert off["prefill_tokens_computed"] == off["prompt_tokens"] and off["prefix_cache_hits"] == 0
    assert cmp["num_requests"] == 6 and cmp["output_tok_s_on_over_off"] > 0


def test_every_stage_is_documented_in_the_header():
    text = SCRIPT.read_text()
    header = text.split("set -uo pipefail")[0]
    body = text.split('for s in "${STAGES[@]}"; do')[1]
    stages = {name for pattern in re.findall(r"^    ([a-z0-9|-]+)\)$", body, flags=re.M) for name in pattern.split("|")}
    documented = set(re.findall(r"^#   ([a-z0-9-]+)\s", header, flags=re.M))
    assert {"fp8w", "so", "gemma3", "w3granite", "rerank", "mamba2", "tests-kernels", "tests-gpu"} <= stages
    assert stages - documented == set()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_w3granite_on_cuda(tmp_path):
    from core_runner.cli import main

    path = _granite_checkpoint(tmp_path / "granite")
    assert main(["bench", "--model", path, "--load-format", "dummy", "--workload", "W3", "--num-requests", "16",
                 "--scale", "4", "--prefix-caching", "on", "off", "--json", str(tmp_path / "w.json")]) == 0
