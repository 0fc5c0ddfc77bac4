"""LlamaForCausalLM assembled from core_runner.layers.

Parameter names follow the Hugging Face checkpoint; ``packed_modules_mapping`` tells
the loader which checkpoint tensors go into the fused q/k/v and gate/up matrices. The
attention layer gets its paged KV cache from the runner and its metadata from the
forward context, so nothing here knows about blocks, rows or batches.

Tensor parallelism comes from the layer classes: q/k/v and gate/up are column-parallel
(each rank computes its own heads / intermediate features), o_proj and down_proj are
row-parallel (they all-reduce back to the full hidden size), and the embedding and LM
head are split over the vocabulary. Everything between (norms, residuals, RoPE) runs
whole on every rank. With one rank the same classes hold whole weights.

For EAGLE-3 speculative decoding the draft reads the residual stream entering a few of
these layers: ``set_aux_hidden_state_layers`` (vLLM's name) makes ``forward`` return
them beside the hidden states. The stream is whole on every rank, as said above.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    Attention,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
    get_rope,
)


def check_supported(config: Any) -> None:
    """Refuse what this model does not implement, rather than run it wrong."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported by core-runner-llama-template: expected 'silu'")


class LlamaAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = config.num_key_value_heads or total_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // total_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, total_heads, total_kv_heads, bias=bias)
        # this rank's share of the heads (all of them with one rank)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden, bias=bias)
        # any rope type transformers knows (Llama 3.x: 'llama3'), from the config
        self.rotary_emb = get_rope(config, self.head_dim)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)
        self.split = [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                      self.num_kv_heads * self.head_dim]

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias=bias)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias=bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
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


class LlamaModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # layers whose input the forward also returns (sorted; empty: return the hidden states alone)
        self.aux_layers: tuple[int, ...] = ()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        x, residual = self.embed_tokens(input_ids), None
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:  # decided on the host, so a captured CUDA graph never changes
                aux += [x if residual is None else x + residual] * self.aux_layers.count(i)
            x, residual = layer(positions, x, residual)
        x = self.norm(x, residual)[0]
        return (x, aux) if self.aux_layers else x


class LlamaForCausalLM(nn.Module):
    """``Model(hf_config)``; ``forward(input_ids, positions) -> hidden`` (or (hidden, aux), see
    ``set_aux_hidden_state_layers``); ``compute_logits``."""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    ignored_weight_patterns = (r"rotary_emb\.inv_freq",)

    def __init__(self, config: Any) -> None:
        super().__init__()
        check_supported(config)
        self.model = LlamaModel(config)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      self.model.embed_tokens if tied else None)
        if tied:  # the shared matrix may also be stored under lm_head
            self.ignored_weight_patterns = (*self.ignored_weight_patterns, r"^lm_head\.weight$")

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """From now on ``forward`` returns (hidden, [residual stream entering each listed
        layer, in layer order]): EAGLE-3's inputs."""
        n = len(self.model.layers)
        bad = [i for i in layers if not 0 <= int(i) < n]
        if bad:
            raise ValueError(f"aux hidden state layers {list(layers)}: {bad} are not layers of a model with "
                             f"num_hidden_layers={n} (expected indices 0..{n - 1})")
        self.model.aux_layers = tuple(sorted(int(i) for i in layers))

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        """vLLM's default EAGLE-3 layers: an early, a middle and a late one."""
        n = len(self.model.layers)
        return (2, n // 2, n - 3)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
