"""GraniteMoeHybridForCausalLM from core_runner.layers: Mamba2 mixers and attention
layers per ``config.layer_types``, a shared MLP plus an optional top-k MoE in every
layer, NoPE or RoPE attention, and Granite's four scalar multipliers (the parts every
Granite family shares are in ``common.py``).

Under tensor parallelism each rank keeps 1/tp of the attention and Mamba heads, of the
shared MLP's and of every expert's intermediate dimension (or, with expert parallelism,
1/tp of the experts whole), and of the vocabulary; the router is replicated. A layer's
shared-MLP and expert outputs are partial sums, added and all-reduced once."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    Mamba2Mixer,
    MergedColumnParallelLinear,
    RowParallelLinear,
    SiluAndMul,
    tensor_model_parallel_all_reduce,
)
from core_runner_granite_hybrid.common import (
    MOE_NAMES,
    GraniteAttention,
    GraniteCausalLM,
    GraniteDecoderLayer,
    GraniteMoE,
    check_silu,
)

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


class SharedMLP(nn.Module):
    """input_linear -> [gate | up] -> silu(gate) * up -> output_linear (HF names). The
    checkpoint's one input_linear tensor stacks gate and up; each rank keeps its slice of
    both. Without ``reduce_results`` the output is this rank's partial sum."""

    def __init__(self, hidden: int, intermediate: int, act: str, reduce_results: bool = True) -> None:
        super().__init__()
        check_silu(act)
        self.input_linear = MergedColumnParallelLinear(hidden, [intermediate, intermediate])
        self.output_linear = RowParallelLinear(intermediate, hidden, reduce_results=reduce_results)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_linear(self.act(self.input_linear(x)))


class GraniteHybridDecoderLayer(GraniteDecoderLayer):
    """A Mamba2 mixer or attention (NoPE unless ``position_embedding_type='rope'``), then the
    shared MLP plus, with ``num_local_experts`` > 0, the top-k MoE."""

    def __init__(self, config: Any, kind: str) -> None:
        super().__init__(config)
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
            pos = getattr(config, "position_embedding_type", None)
            if pos not in (None, "nope", "rope"):
                raise ValueError(f"position_embedding_type={pos!r} is not supported: expected None or 'rope'")
            self.self_attn = GraniteAttention(config, rope=pos == "rope")
        has_moe = (config.num_local_experts or 0) > 0
        # with experts, the shared MLP's partial sum joins theirs in one all-reduce
        self.shared_mlp = SharedMLP(h, config.shared_intermediate_size, config.hidden_act, reduce_results=not has_moe)
        self.block_sparse_moe = GraniteMoE(config, reduce_results=False) if has_moe else None

    def mix(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return self.mamba(h) if self.kind == "mamba" else self.self_attn(positions, h)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        m = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            m = tensor_model_parallel_all_reduce(self.block_sparse_moe(h) + m)
        return m


class GraniteMoeHybridForCausalLM(GraniteCausalLM):
    weight_names = MOE_NAMES

    def __init__(self, config: Any) -> None:
        super().__init__(config, [GraniteHybridDecoderLayer(config, k) for k in layer_types_of(config)])
