"""GraniteMoeHybridForCausalLM from core_runner.layers: Mamba2 mixers and attention
layers per ``config.layer_types``, a shared MLP plus an optional top-k MoE in every
layer, NoPE or RoPE attention, and Granite's four scalar multipliers."""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.layers import (
    Attention,
    Linear,
    LMHead,
    QKVLinear,
    RMSNorm,
    SiluAndMul,
    VocabEmbedding,
    get_rope,
)
from core_runner.layers.linear import default_weight_loader
from core_runner.layers.mamba2 import Mamba2Mixer

MAMBA_TYPES = ("mamba", "linear_attention")
ATTENTION_TYPES = ("attention", "full_attention")


def layer_types_of(config: Any) -> list[str]:
    types = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    if types is None:
        types = ["mamba"] * config.num_hidden_layers
    if len(types) != config.num_hidden_layers:
        raise ValueError(f"layer_types has {len(types)} entries for num_hidden_layers={config.num_hidden_layers}")
    out = []
    for t in types:
        if t in MAMBA_TYPES:
            out.append("mamba")
        elif t in ATTENTION_TYPES:
            out.append("attention")
        else:
            raise ValueError(f"layer type {t!r} is not supported: expected one of {MAMBA_TYPES + ATTENTION_TYPES}")
    return out


class GraniteAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.num_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVLinear(h, self.head_dim, self.num_heads, self.num_kv_heads, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, h, bias=bias)
        kind = getattr(config, "position_embedding_type", None)
        if kind not in (None, "nope", "rope"):
            raise ValueError(f"position_embedding_type={kind!r} is not supported: expected None or 'rope'")
        self.rotary_emb = None
        if kind == "rope":
            self.rotary_emb = get_rope(config, self.head_dim)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, float(config.attention_multiplier))
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(
                positions, q.reshape(-1, self.num_heads, self.head_dim), k.reshape(-1, self.num_kv_heads, self.head_dim)
            )
        return self.o_proj(self.attn(q, k, v))


class SharedMLP(nn.Module):
    """input_linear -> [gate | up] -> silu(gate) * up -> output_linear (HF names)."""

    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={act!r} is not supported: expected 'silu'")
        self.input_linear = Linear(hidden, 2 * intermediate)
        self.output_linear = Linear(intermediate, hidden)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_linear(self.act(self.input_linear(x)))


class TopKRouter(nn.Module):
    def __init__(self, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k experts per token and their weights (softmax over the k chosen logits)."""
        logits = F.linear(x, self.weight).float()
        top, idx = logits.topk(self.top_k, dim=-1)
        return torch.softmax(top, dim=-1).to(x.dtype), idx


class Experts(nn.Module):
    """Expert weights stacked as in the HF checkpoint: gate_up_proj [E, 2I, H], down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate), requires_grad=False)
        self.gate_up_proj.weight_loader = default_weight_loader
        self.down_proj.weight_loader = default_weight_loader

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        if x.device.type == "cuda":
            # no data-dependent shapes (graph safe, no host sync): every expert sees every
            # token, weighted by its routing weight (zero where it was not chosen)
            for e in range(self.num_experts):
                w = (weights * (idx == e)).sum(dim=-1, keepdim=True)
                out += self._expert(e, x) * w
            return out
        for e in idx.unique().tolist():
            tok, slot = torch.where(idx == e)
            out.index_add_(0, tok, self._expert(e, x[tok]) * weights[tok, slot, None])
        return out


class SparseMoE(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.router = TopKRouter(config.hidden_size, config.num_local_experts, config.num_experts_per_tok)
        self.experts = Experts(config.num_local_experts, config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = self.router(x)
        return self.experts(x, weights, idx)


class GraniteHybridDecoderLayer(nn.Module):
    def __init__(self, config: Any, kind: str) -> None:
        super().__init__()
        h = config.hidden_size
        self.kind = kind
        if kind == "mamba":
            self.mamba = Mamba2Mixer(
                h, num_heads=config.mamba_n_heads, head_dim=config.mamba_d_head, d_state=config.mamba_d_state,
                n_groups=config.mamba_n_groups, d_conv=config.mamba_d_conv,
                expand_size=int(config.mamba_expand * h), chunk_size=config.mamba_chunk_size,
                conv_bias=bool(config.mamba_conv_bias), proj_bias=bool(config.mamba_proj_bias),
                norm_eps=config.rms_norm_eps, activation=config.hidden_act,
                dt_limit=getattr(config, "time_step_limit", None),
            )
        else:
            self.self_attn = GraniteAttention(config)
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.shared_mlp = SharedMLP(h, config.shared_intermediate_size, config.hidden_act)
        self.block_sparse_moe = SparseMoE(config) if (config.num_local_experts or 0) > 0 else None
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        h = self.mamba(h) if self.kind == "mamba" else self.self_attn(positions, h)
        x = x + h * self.residual_multiplier
        h = self.post_attention_layernorm(x)
        m = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            m = self.block_sparse_moe(h) + m
        return x + m * self.residual_multiplier


class GraniteHybridModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GraniteHybridDecoderLayer(config, k) for k in layer_types_of(config))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embedding_multiplier = float(config.embedding_multiplier)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.embedding_multiplier
        for layer in self.layers:
            x = layer(positions, x)
        return self.norm(x)


class GraniteMoeHybridForCausalLM(nn.Module):
    packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
    ignored_weight_patterns = (r"rotary_emb\.inv_freq",)
    # checkpoints written before transformers 5 name the MoE tensors differently
    _legacy_names = (
        (re.compile(r"block_sparse_moe\.input_linear\.weight$"), "block_sparse_moe.experts.gate_up_proj"),
        (re.compile(r"block_sparse_moe\.output_linear\.weight$"), "block_sparse_moe.experts.down_proj"),
        (re.compile(r"block_sparse_moe\.router\.layer\.weight$"), "block_sparse_moe.router.weight"),
    )

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.model = GraniteHybridModel(config)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, self.model.embed_tokens if tied else None)
        if tied:
            self.ignored_weight_patterns = (*self.ignored_weight_patterns, r"^lm_head\.weight$")
        self.logits_scaling = float(config.logits_scaling)

    def map_weight_name(self, name: str) -> str:
        for pattern, new in self._legacy_names:
            name = pattern.sub(new, name)
        return name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) / self.logits_scaling
