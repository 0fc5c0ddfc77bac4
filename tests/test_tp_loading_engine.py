"""Region loading in a real tensor-parallel engine: a tiny fp8 (DeepSeek-V3 block format)
Llama served with tensor_parallel_size=2 (rank 0 in this process, rank 1 a spawned
worker) reads and dequantizes each rank's slices, and generates exactly what TP=1 does.

The blocks (24 x 24) are aligned to none of the splits (o_proj columns 32, down_proj
columns 64), so partial scale blocks are read on some rank. The model is the template
plugin's Llama with split projections (tests/tp_llama_fixture.py).
"""
from __future__ import annotations

import importlib
import json

import pytest
import torch
from helpers import Recorder, greedy, random_prompts, run
from test_tp_loading import Reads

from core_runner import LLM
from core_runner.conformance.quantized import write_fp8_checkpoint
from core_runner.layers.fp8_weight import dense_weight
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_llama_template", reason="pip install -e examples/plugin_template (requirements-dev)")

CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
    initializer_range=0.15, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
BLOCK = (24, 24)


@pytest.fixture(scope="module")
def fp8_llama(tmp_path_factory, single_torch_thread):
    import transformers

    path = tmp_path_factory.mktemp("tp_llama") / "fp8"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(BLOCK)}
    (path / "config.json").write_text(json.dumps(cfg))
    write_fp8_checkpoint(path, transformers.LlamaForCausalLM, BLOCK)
    return path


def _engine(path, tp: int):
    pm = PluginManager()
    pm.register_module("tp_llama", importlib.import_module("tp_llama_fixture"))
    # a 16-token budget splits the 23-token prompt into chunks
    return LLM(str(path), plugins=pm, tensor_parallel_size=tp, dtype="float32", device="cpu", max_model_len=64,
               max_num_seqs=4, max_num_batched_tokens=16, block_size=4, num_kv_blocks=64, enforce_eager=True).engine


def test_tp2_engine_loads_its_fp8_slices_and_generates_as_tp1(fp8_llama, monkeypatch):
    prompts = random_prompts([5, 23, 9], seed=11, vocab=CONFIG["vocab_size"])
    requests = [(f"r{i}", p, greedy(6)) for i, p in enumerate(prompts)]
    runs = {}
    for tp in (1, 2):
        reads = Reads(monkeypatch)  # rank 0's reads (it loads in this process)
        engine = _engine(fp8_llama, tp)
        name = "model.layers.0.self_attn.o_proj.weight"
        assert reads.of(name) == [((0, 64), (0, 64 // tp))]
        assert reads.of(name + "_scale_inv") == [((0, 3), (0, 2 if tp == 2 else 3))]  # 32 columns: 2 partial blocks
        try:
            rec = Recorder(engine)
            outs = run(engine, requests)
            # resident fp8 (weight + block scales): compared as the values they stand for
            o_proj = dense_weight(engine.model.model.layers[0].self_attn.o_proj).detach().clone()
            qkv = dense_weight(engine.model.model.layers[1].self_attn.qkv_proj).detach().clone()
            runs[tp] = outs, rec, o_proj, qkv
        finally:
            engine.shutdown()
    (outs1, rec1, o1, qkv1), (outs2, rec2, o2, qkv2) = runs[1], runs[2]
    # rank 0 holds exactly its slices of the TP=1 dequantized weights
    assert o2.shape == (64, 32) and torch.equal(o2, o1[:, :32])
    assert torch.equal(qkv2, torch.cat([qkv1[:32], qkv1[64:80], qkv1[96:112]]))
    for req_id, _, _ in requests:
        assert outs2[req_id].token_ids == outs1[req_id].token_ids, req_id
        a, b = dict(rec1.logits_of(req_id)), dict(rec2.logits_of(req_id))
        assert a.keys() == b.keys() and len(a) >= 6, req_id
        for pos in a:
            err = (a[pos] - b[pos]).abs().max().item()
            assert err <= 1e-4, f"{req_id} position {pos}: TP=2 logits differ from TP=1 by {err:.3g}"
