"""The standard decoder blocks (core_runner.layers: DecoderAttention, PreNormDecoderLayer,
DecoderStack, CausalLM): a model assembled from them has exactly transformers' tensor
names once q/k/v and gate/up are packed, the options build what they say, and the sink
loader and aux-layer check refuse what they cannot take. (Logits against transformers
are the conformance suite's job, per family.)"""
from __future__ import annotations

import re

import pytest
import torch

from core_runner.layers import (
    CausalLM,
    DecoderAttention,
    DecoderStack,
    GatedMLP,
    GemmaRMSNorm,
    PreNormDecoderLayer,
    RMSNorm,
    check_aux_layers,
)


def _llama_config(**kw):
    import transformers

    return transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **kw)


def _packed(name: str, mapping: dict) -> str:
    parts = name.split(".")
    for key, (fused, _) in mapping.items():
        if key in parts:
            return ".".join(fused if p == key else p for p in parts)
    return name


def _llama(config) -> CausalLM:
    def layer(cfg, i):
        mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, bias=cfg.mlp_bias)
        return PreNormDecoderLayer(DecoderAttention(cfg), mlp, cfg.hidden_size, cfg.rms_norm_eps)
    return CausalLM(config, DecoderStack(config, layer))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_names_are_transformers_llama_names(tied, bias):
    import transformers

    config = _llama_config(tie_word_embeddings=tied, attention_bias=bias, mlp_bias=bias)
    hf = transformers.LlamaForCausalLM(config)
    mine = _llama(config)
    hf_names = {_packed(n, mine.packed_modules_mapping) for n in hf.state_dict()}
    names = set(mine.state_dict())
    if tied:  # the head reads the embedding's matrix: a copy stored under lm_head is skipped
        assert any(re.search(p, "lm_head.weight") for p in mine.ignored_weight_patterns)
        hf_names.discard("lm_head.weight")
        names.discard("lm_head.weight")
    assert names == hf_names
    assert (mine.lm_head.weight is mine.model.embed_tokens.weight) == tied


def test_options_build_what_they_say():
    config = _llama_config()
    plain = DecoderAttention(config)
    assert plain.q_norm is None and plain.sinks is None and plain.attn.scale == pytest.approx(8 ** -0.5)
    gemma_like = DecoderAttention(config, qk_norm=GemmaRMSNorm, scale=0.25, sliding_window=16, logits_soft_cap=30.0)
    assert isinstance(gemma_like.q_norm, GemmaRMSNorm) and isinstance(gemma_like.k_norm, GemmaRMSNorm)
    assert gemma_like.attn.scale == 0.25 and gemma_like.attn.sliding_window == 16
    assert gemma_like.attn.options.logits_soft_cap == 30.0
    nope = DecoderAttention(config, rope=False, input_size=64)
    assert nope.rotary_emb is None and nope.qkv_proj.weight.shape[1] == 64
    qwen_like = DecoderAttention(config, qk_norm=RMSNorm)
    assert {n for n, _ in qwen_like.named_parameters()} >= {"q_norm.weight", "k_norm.weight"}


def test_sinks_load_and_refuse_a_wrong_shape():
    attn = DecoderAttention(_llama_config(), sinks=True)
    assert "sinks" in dict(attn.named_parameters())
    assert attn.attn.sinks is attn.sinks  # the attention layer reads the loaded tensor
    logits = torch.arange(4, dtype=torch.float32)
    attn.sinks.weight_loader(attn.sinks, logits)
    torch.testing.assert_close(attn.sinks.data, logits)
    with pytest.raises(ValueError, match=r"sinks have shape \(3,\), expected \(4,\)"):
        attn.sinks.weight_loader(attn.sinks, torch.zeros(3))
    with pytest.raises(ValueError, match="sinks are not fused"):
        attn.sinks.weight_loader(attn.sinks, logits, "q")


def test_aux_layers_sorted_and_checked():
    assert check_aux_layers((3, 1), 4) == (1, 3)
    with pytest.raises(ValueError, match=r"\[4\] are not layers of a model with num_hidden_layers=4"):
        check_aux_layers((1, 4), 4)
