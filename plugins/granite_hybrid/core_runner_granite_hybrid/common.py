"""What every Granite family shares (Granite 3.x dense and MoE, Granite 4.0 hybrid):
attention scaled by ``attention_multiplier``, a top-k MoE, pre-norm layers whose two
branches join the residual stream scaled by ``residual_multiplier``, embeddings scaled
by ``embedding_multiplier`` and logits divided by ``logits_scaling``.

    x = embed(ids) * embedding_multiplier
    per layer: x += mixer(norm(x)) * residual_multiplier; x += ffn(norm(x)) * residual_multiplier
    logits = lm_head(norm(x)) / logits_scaling

Under tensor parallelism attention keeps 1/tp of the heads (KV heads replicated when tp
exceeds them), the MoE 1/tp of every expert's intermediate units (or, with expert
parallelism, 1/tp of the experts whole; the router is replicated so every rank picks the
same experts), the embedding and LM head 1/tp of the vocabulary."""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    CausalLM,
    DecoderAttention,
    FusedMoE,
    Linear,
    RMSNorm,
    VocabParallelEmbedding,
    divide,
    expert_parallel_enabled,
    get_tensor_model_parallel_world_size,
    softmax_topk,
)

# the SiLU-gated MLPs and experts are what the layers implement (transformers reads
# hidden_act through ACT2FN, so any activation name would be legal there)
SILU = ("silu", "swish")


def check_silu(act: str) -> None:
    """ValueError naming hidden_act unless it is SiLU."""
    if act not in SILU:
        raise ValueError(f"hidden_act={act!r} is not supported: expected 'silu'")


class GraniteAttention(DecoderAttention):
    """GQA whose softmax scale is ``attention_multiplier`` (not head_dim ** -0.5); RoPE
    from the config's ``rope_parameters`` when ``rope``, none otherwise (NoPE layers of
    the hybrid)."""

    def __init__(self, config: Any, rope: bool) -> None:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # the whole head rotates: Granite's default RoPE ignores a partial_rotary_factor
        super().__init__(config, scale=float(config.attention_multiplier), rope=rope, rotary_dim=head_dim)


class GraniteMoE(nn.Module):
    """``block_sparse_moe``: a bias-free ``router`` over ``num_local_experts`` experts, the
    top ``num_experts_per_tok`` kept and weighted by the softmax over their logits (the
    same as the softmax over all experts renormalised over the kept ones), then SiLU-gated
    experts of ``intermediate_size`` units (``FusedMoE``: Triton grouped GEMM on the GPU).
    Without ``reduce_results`` the output is this rank's partial sum (the hybrid adds its
    shared MLP's before one all-reduce)."""

    def __init__(self, config: Any, reduce_results: bool = True) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        num_experts, hidden, inter = config.num_local_experts, config.hidden_size, config.intermediate_size
        # named after Granite's config fields (FusedMoE would name its own)
        if expert_parallel_enabled():
            divide(num_experts, tp, "num_local_experts (split by expert parallelism)")
        else:
            divide(inter, tp, "intermediate_size (of each expert)")
        self.top_k = config.num_experts_per_tok
        self.router = Linear(hidden, num_experts)
        self.experts = FusedMoE(num_experts, hidden, inter, reduce_results=reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(self.router(x), self.top_k, True)
        return self.experts(x, weights, ids)


# checkpoint tensor names -> the FusedMoE's: transformers (5.25 too) writes the stacked
# experts as input_linear / output_linear and the router as router.layer; its in-memory
# names (experts.gate_up_proj / down_proj, router.weight) are accepted as well
MOE_NAMES = (
    (re.compile(r"block_sparse_moe\.(input_linear\.weight|experts\.gate_up_proj)$"),
     "block_sparse_moe.experts.w13.weight"),
    (re.compile(r"block_sparse_moe\.(output_linear\.weight|experts\.down_proj)$"),
     "block_sparse_moe.experts.w2.weight"),
    (re.compile(r"block_sparse_moe\.router\.layer\.weight$"), "block_sparse_moe.router.weight"),
)


class GraniteDecoderLayer(nn.Module):
    """Pre-norm mixer + feed-forward block, each branch scaled by ``residual_multiplier``.
    A family's layer sets its mixer (``self_attn`` by default, see ``mix``) and
    implements ``feed_forward``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_multiplier = float(config.residual_multiplier)

    def mix(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.self_attn(positions, h)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(positions, self.input_layernorm(x)) * self.residual_multiplier
        return x + self.feed_forward(self.post_attention_layernorm(x)) * self.residual_multiplier


class GraniteModel(nn.Module):
    def __init__(self, config: Any, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embedding_multiplier = float(config.embedding_multiplier)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids) * self.embedding_multiplier
        for layer in self.layers:
            x = layer(positions, x)
        return self.norm(x)


class GraniteCausalLM(CausalLM):
    """``model`` (a GraniteModel of the given layers) + LM head (tied to the embedding when
    ``tie_word_embeddings``), logits divided by ``logits_scaling``; checkpoint names per
    ``packed_modules_mapping`` and ``weight_names`` (regex, replacement) pairs."""

    packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
    weight_names: tuple[tuple[re.Pattern, str], ...] = ()

    def __init__(self, config: Any, layers: list[nn.Module]) -> None:
        super().__init__(config, GraniteModel(config, layers))
        self.logits_scaling = float(config.logits_scaling)

    def map_weight_name(self, name: str) -> str:
        for pattern, new in self.weight_names:
            name = pattern.sub(new, name)
        return name

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) / self.logits_scaling
