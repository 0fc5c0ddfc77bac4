"""MistralForCausalLM from core_runner.layers: Llama's decoder (GQA, RoPE, pre-norm RMSNorm
blocks, gated MLP) with sliding-window attention on every layer.

``sliding_window`` in the config is the window of every layer (transformers' rule: a
query at position p sees keys p - window < k <= p); ``None`` (Mistral-7B-v0.3, Nemo) is
full causal attention. The window is an option of each ``Attention`` layer, so its cache
spec carries it and the backend masks by it; nothing else in the model knows about it.

Under tensor parallelism (vLLM's split) each rank holds num_attention_heads / tp query
heads and num_key_value_heads / tp KV heads (one KV head, replicated, when tp exceeds
their count); o_proj and down_proj are row-parallel (one all-reduce each), gate/up
column-parallel, and the embedding and LM head split the vocabulary.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    Attention,
    GatedMLP,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_head_split,
    get_rope,
)


class MistralAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        check_head_split(total_heads, total_kv_heads)
        self.head_dim = getattr(config, "head_dim", None) or hidden // total_heads
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, total_heads, total_kv_heads, bias=False)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden, bias=False)
        self.rotary_emb = get_rope(config, self.head_dim)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5,
                              sliding_window=getattr(config, "sliding_window", None))
        self.split = [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                      self.num_kv_heads * self.head_dim]

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))




class MistralDecoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self_attn = MistralAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # pre-norm residual blocks; RMSNorm(x, residual) adds, normalises, returns both
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class MistralModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MistralDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]


class MistralForCausalLM(nn.Module):
    """``Model(hf_config)``; ``forward(input_ids, positions) -> hidden``; ``compute_logits``."""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    ignored_weight_patterns = (r"rotary_emb\.inv_freq",)

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.model = MistralModel(config)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, self.model.embed_tokens if tied else None)
        if tied:  # the shared matrix may also be stored under lm_head
            self.ignored_weight_patterns = (*self.ignored_weight_patterns, r"^lm_head\.weight$")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
