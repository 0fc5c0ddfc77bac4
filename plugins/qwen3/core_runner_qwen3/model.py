"""Qwen3ForCausalLM from core_runner.layers: GQA with per-head q/k RMSNorm before RoPE.

Under tensor parallelism (vLLM's split) each rank holds num_attention_heads / tp query
heads and num_key_value_heads / tp KV heads (one KV head, replicated, when tp exceeds
their count), so its attention layers and KV cache are the rank's; o_proj and
down_proj are row-parallel (one all-reduce each), gate/up column-parallel, and the
embedding and LM head split the vocabulary. q_norm / k_norm act per head, so they are
whole on every rank.

EAGLE-3 drafts read the residual stream at the inputs of a few target layers
(``set_aux_hidden_state_layers``); the stream is whole on every rank, so under tensor
parallelism each rank hands its draft the same states.
"""
from __future__ import annotations

from typing import Any, Callable

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
    check_head_split,
    divide,
    get_rope,
    get_tensor_model_parallel_world_size,
)


class Qwen3Attention(nn.Module):
    """GQA with per-head q/k RMSNorm before RoPE. ``qk_norm=False`` is Llama's attention
    (the EAGLE drafts' layers), ``input_size`` the width q/k/v read (2H in EAGLE-3's first
    layer), ``max_position`` the RoPE table's length (the config's by default)."""

    def __init__(self, config: Any, *, input_size: int | None = None, qk_norm: bool = True,
                 max_position: int | None = None, sliding_window: int | None = None) -> None:
        super().__init__()
        h = config.hidden_size
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        check_head_split(total_heads, total_kv_heads)
        self.head_dim = getattr(config, "head_dim", None) or h // total_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(input_size or h, self.head_dim, total_heads, total_kv_heads, bias=bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.rotary_emb = get_rope(config, self.head_dim, max_position=max_position)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5,
                              sliding_window=sliding_window)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class Qwen3MLP(nn.Module):
    """SiLU-gated MLP of ``intermediate`` units (the config's intermediate_size), 1/tp of
    them on each rank."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        divide(intermediate, get_tensor_model_parallel_world_size(), "intermediate_size")
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate])
        self.down_proj = RowParallelLinear(intermediate, hidden)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class Qwen3DecoderLayer(nn.Module):
    """Pre-norm attention + MLP block; ``mlp`` lets a variant (MoE) swap the MLP, ``attn``
    the attention (the EAGLE drafts' Llama attention), and ``input_layernorm=False`` drops the
    first norm (EAGLE's first layer: its input enters attention as it is)."""

    def __init__(self, config: Any, mlp: nn.Module | None = None, attn: nn.Module | None = None,
                 input_layernorm: bool = True, sliding_window: int | None = None) -> None:
        super().__init__()
        self.self_attn = attn if attn is not None else Qwen3Attention(config, sliding_window=sliding_window)
        self.mlp = mlp if mlp is not None else Qwen3MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if input_layernorm else None
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            if self.input_layernorm is not None:
                x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


def layer_window(config: Any, layer_idx: int) -> int | None:
    """The sliding window of layer ``layer_idx`` as transformers applies it: from
    ``layer_types`` where the config has them (Qwen3: layers from max_window_layers on when
    use_sliding_window), else ``sliding_window`` on every layer (Qwen3-MoE); the configs
    set sliding_window to None unless use_sliding_window."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or types is None:
        return window
    return window if types[layer_idx] == "sliding_attention" else None


def eagle3_default_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 target layers: an early, a middle and a late one."""
    return (2, num_layers // 2, num_layers - 3)


def check_aux_layers(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """``layers`` as a sorted tuple of ints (vLLM hands the states over in layer order),
    each the index of one of the ``num_layers`` layers."""
    layers = tuple(sorted(int(i) for i in layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux hidden state layers {list(layers)}: {bad} are not layers of a model with "
                         f"num_hidden_layers={num_layers} (expected indices 0..{num_layers - 1})")
    return layers


class Qwen3Model(nn.Module):
    """``forward`` returns the final hidden states or, once ``aux_layers`` is set, also
    the residual stream entering each of those layers (EAGLE-3's inputs)."""

    def __init__(self, config: Any, make_layer: Callable[[Any, int], nn.Module] | None = None) -> None:
        super().__init__()
        make_layer = make_layer or (lambda cfg, i: Qwen3DecoderLayer(cfg, sliding_window=layer_window(cfg, i)))
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(make_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.aux_layers: tuple[int, ...] = ()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        x, residual = self.embed_tokens(input_ids), None
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:  # a host-side test: the captured graph is the same every step
                aux += [x if residual is None else x + residual] * self.aux_layers.count(i)
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return (x, aux) if self.aux_layers else x


class AuxHiddenStates:
    """vLLM's EAGLE-3 target methods, for a causal LM whose ``model`` is a Qwen3Model."""

    model: Qwen3Model

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """From now on ``forward`` returns (hidden, [residual stream entering each listed
        layer, in layer order])."""
        self.model.aux_layers = check_aux_layers(layers, len(self.model.layers))

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return eagle3_default_layers(len(self.model.layers))


class Qwen3ForCausalLM(AuxHiddenStates, nn.Module):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    ignored_weight_patterns = (r"rotary_emb\.inv_freq",)

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.model = Qwen3Model(config)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, self.model.embed_tokens if tied else None)
        if tied:  # some checkpoints store the shared matrix twice
            self.ignored_weight_patterns = (*self.ignored_weight_patterns, r"^lm_head\.weight$")

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
