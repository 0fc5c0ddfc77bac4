"""Qwen3MoeForCausalLM (qwen3 plugin, shared FusedMoE) against transformers.

Two tiny checkpoints: norm_topk_prob with a dense layer from mlp_only_layers, and no
renormalisation with decoder_sparse_step=2 (every other layer sparse), top-3 routing.
"""
from __future__ import annotations

import pytest
import torch
from helpers import (
    Checkpoint,
    Recorder,
    assert_logits_match_hf,
    greedy,
    hf_greedy,
    make_engine,
    random_prompts,
    run,
)

BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    num_experts=8, num_experts_per_tok=2, initializer_range=0.12, tie_word_embeddings=False,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
CONFIGS = {
    "norm-mlp-only": (dict(norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1), 0),
    "nonorm-step2": (dict(norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=2,
                          num_experts_per_tok=3, tie_word_embeddings=True), 1),
}


@pytest.fixture(scope="module")
def moe_ckpts(tmp_path_factory, single_torch_thread):
    import transformers

    root = tmp_path_factory.mktemp("qwen3_moe_tiny")
    out = {}
    for name, (extra, seed) in CONFIGS.items():
        torch.manual_seed(seed)
        hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{**BASE, **extra})).float().eval()
        hf.save_pretrained(str(root / name))
        out[name] = Checkpoint(name=name, path=str(root / name), hf=hf)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hf(moe_ckpts, name):
    ckpt = moe_ckpts[name]
    engine = make_engine(ckpt)
    rec = Recorder(engine)
    prompts = random_prompts([2, 9, 23, 41], seed=7)
    outs = run(engine, [(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)])
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= len(prompts) * 8
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, 8)


def test_sparse_layer_layout(moe_ckpts):
    from core_runner_qwen3.model_moe import Qwen3MoeForCausalLM

    from core_runner.layers.fused_moe import FusedMoE

    for name in CONFIGS:
        hf = moe_ckpts[name].hf
        ours = Qwen3MoeForCausalLM(hf.config)
        for i, (a, b) in enumerate(zip(ours.model.layers, hf.model.layers)):
            assert isinstance(a.mlp.experts if hasattr(a.mlp, "experts") else None, FusedMoE) == hasattr(
                b.mlp, "experts"), f"{name} layer {i}"


@pytest.mark.parametrize("scenario", ["chunked", "preempt"])
def test_greedy_tokens_chunked_and_preempted(moe_ckpts, scenario):
    ckpt = moe_ckpts["norm-mlp-only"]
    prompts = random_prompts([4, 17, 30, 12], seed=9)
    if scenario == "chunked":
        engine = make_engine(ckpt, max_num_batched_tokens=8, max_model_len=64)
    else:
        engine = make_engine(ckpt, max_model_len=64, num_kv_blocks=20, max_num_seqs=4)
    outs = run(engine, [(f"r{i}", p, greedy(10)) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, 10)
    if scenario == "preempt":
        assert engine.scheduler.num_preemptions > 0


def test_softmax_topk_matches_reference_router(moe_ckpts):
    from core_runner.layers.moe_routing import softmax_topk

    for name in CONFIGS:
        hf = moe_ckpts[name].hf
        router = next(layer.mlp.gate for layer in hf.model.layers if hasattr(layer.mlp, "gate"))
        x = torch.randn(50, hf.config.hidden_size, generator=torch.Generator().manual_seed(4))
        logits, w_ref, id_ref = router(x)
        w, ids = softmax_topk(logits, hf.config.num_experts_per_tok, hf.config.norm_topk_prob)
        assert torch.equal(ids.long(), id_ref)
        torch.testing.assert_close(w, w_ref.float(), rtol=1e-6, atol=1e-7)
