"""DeepseekV2ForCausalLM / DeepseekV3ForCausalLM from core_runner.layers.

Attention is MLA: q through a low-rank path (q_a_proj -> q_a_layernorm -> q_b_proj) or a
direct q_proj; kv_a_proj_with_mqa gives the latent (kv_lora_rank, normalised by
kv_a_layernorm) and one shared rope key (qk_rope_head_dim); RoPE touches only the rope
halves. The cache keeps [latent | rope key] per token (``MLAAttention``), kv_b_proj is
absorbed, so decode reads only the latent cache.

RoPE (``get_rope``, any rope type; DeepSeek-V2-Lite/V3 use YaRN) follows transformers:
DeepSeek-V2 rotates interleaved pairs (x0, x1), (x2, x3), ...; DeepSeek-V3 does the same
when ``rope_interleave`` (the default) and rotates halves otherwise. (V3's transformers code
writes the rotated pairs de-interleaved; q_pe and k_pe get the same order either way, so
their dot products, all attention uses, are equal.) With YaRN and ``mscale_all_dim`` the
softmax scale carries the magnitude correction (``yarn_softmax_scale``).

MLP: dense for the first ``first_k_dense_replace`` layers, then routed experts
(``FusedMoE``) plus shared experts. Routing: V2 softmax greedy / group-limited greedy
times routed_scaling_factor; V3 sigmoid + e_score_correction_bias, groups by top-2 sums,
optional renormalisation, times routed_scaling_factor.

Tensor parallelism (vLLM's split): attention heads, the dense and shared MLPs'
intermediate dimension and the vocabulary are split across ranks; the MLA latent
projection, its cache and the router are replicated; the routed experts are split as
FusedMoE splits them (1/tp of each expert's intermediate dimension, or whole experts per
rank with expert parallelism), and one all-reduce per MoE layer sums the routed and
shared experts' partial outputs. With one rank every layer is whole.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.layers import (
    CausalLM,
    ColumnParallelLinear,
    DecoderStack,
    MergedColumnParallelLinear,
    PreNormDecoderLayer,
    ReplicatedLinear,
    RMSNorm,
    RowParallelLinear,
    SiluAndMul,
    divide,
    get_rope,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
    yarn_softmax_scale,
)
from core_runner.layers.fused_moe import FusedMoE, expert_packed_mapping
from core_runner.layers.linear import default_weight_loader
from core_runner.layers.mla import MLAAttention
from core_runner.layers.moe_routing import check_expert_groups, grouped_topk_v2, grouped_topk_v3


class DeepseekMLA(nn.Module):
    """MLA with its heads split across tensor-parallel ranks: the query projection (q_proj,
    or q_b_proj after the replicated q_a_proj and its norm), kv_b_proj and o_proj's input
    are split by heads; kv_a_proj_with_mqa is replicated because the latent and the rope
    key are shared by all heads, so every rank caches the same full latent."""

    def __init__(self, config: Any, interleaved_rope: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.total_num_heads = config.num_attention_heads
        self.num_heads = divide(self.total_num_heads, get_tensor_model_parallel_world_size(), "num_attention_heads")
        self.q_lora_rank = config.q_lora_rank
        self.kv_lora_rank = config.kv_lora_rank
        self.nope, self.rope, self.v_dim = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        qk_head_dim = self.nope + self.rope
        bias = bool(getattr(config, "attention_bias", False))
        # checkpoint rows are head-major ([head 0 | head 1 | ...]), so the contiguous
        # row blocks of a column-parallel layer are whole heads
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(h, self.total_num_heads * qk_head_dim)
        else:
            self.q_a_proj = ReplicatedLinear(h, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, 1e-6)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, self.total_num_heads * qk_head_dim)
        self.kv_a_proj_with_mqa = ReplicatedLinear(h, self.kv_lora_rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, 1e-6)
        # dense: MLA absorbs its halves into the query and the output (layers.MLAAttention), as vLLM
        # does after loading, so an fp8 checkpoint's kv_b_proj is dequantized at load
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank, self.total_num_heads * (self.nope + self.v_dim),
                                              quantized=False)
        self.o_proj = RowParallelLinear(self.total_num_heads * self.v_dim, h, bias=bias)
        self.rotary_emb = get_rope(config, self.rope, rotary_dim=self.rope, is_neox_style=not interleaved_rope)
        # the scale depends on the head dimension only, never on how many heads a rank holds
        self.attn = MLAAttention(self.num_heads, self.kv_lora_rank, self.nope, self.rope, self.v_dim,
                                 yarn_softmax_scale(config, qk_head_dim))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(-1, self.num_heads, self.nope + self.rope)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        kv_c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope], dim=-1)
        kv_c = self.kv_a_layernorm(kv_c)
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        return self.o_proj(self.attn(q_nope, q_pe, kv_c, k_pe, self.kv_b_proj.weight))


class DeepseekMLP(nn.Module):
    """SiLU-gated MLP, its intermediate dimension split across ranks; down_proj sums the
    ranks' partial outputs, so every rank returns the full [T, hidden] (without
    ``reduce_results``, this rank's partial sum)."""

    def __init__(self, hidden: int, intermediate: int, reduce_results: bool = True) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate])
        self.down_proj = RowParallelLinear(intermediate, hidden, reduce_results=reduce_results)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DeepseekRouter(nn.Module):
    """Router weight kept in float32 (as the reference does) and, for V3, the correction bias."""

    def __init__(self, num_experts: int, hidden: int, with_bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden, dtype=torch.float32), requires_grad=False)
        self.weight.weight_loader = default_weight_loader
        if with_bias:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32),
                                                        requires_grad=False)
            self.e_score_correction_bias.weight_loader = default_weight_loader
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)


class DeepseekMoE(nn.Module):
    def __init__(self, config: Any, version: int) -> None:
        super().__init__()
        self.version = version
        self.top_k = config.num_experts_per_tok
        self.num_experts = config.n_routed_experts
        self.scaling = float(getattr(config, "routed_scaling_factor", 1.0) or 1.0)
        self.n_group, self.topk_group = getattr(config, "n_group", None), getattr(config, "topk_group", None)
        if version == 2:
            self.topk_method = getattr(config, "topk_method", "greedy") or "greedy"
            if self.topk_method not in ("greedy", "group_limited_greedy"):
                raise ValueError(f"topk_method={self.topk_method!r} is not supported for DeepSeek-V2: "
                                 "expected 'greedy' or 'group_limited_greedy'")
        else:
            self.norm_topk_prob = bool(getattr(config, "norm_topk_prob", True))
        if version == 3 or self.topk_method == "group_limited_greedy":
            check_expert_groups(self.num_experts, self.n_group, self.topk_group)
        self.gate = DeepseekRouter(self.num_experts, config.hidden_size, with_bias=version == 3)
        # both return this rank's partial sum; forward reduces them together, once
        self.experts = FusedMoE(self.num_experts, config.hidden_size, config.moe_intermediate_size,
                                reduce_results=False)
        n_shared = getattr(config, "n_shared_experts", None) or 0
        self.shared_experts = (DeepseekMLP(config.hidden_size, config.moe_intermediate_size * n_shared,
                                           reduce_results=False) if n_shared else None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(x)
        if self.version == 2:
            return grouped_topk_v2(logits, self.top_k, self.topk_method, self.n_group, self.topk_group, self.scaling)
        return grouped_topk_v3(logits, self.gate.e_score_correction_bias, self.top_k, self.n_group,
                               self.topk_group, self.norm_topk_prob, self.scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the router is replicated, so every rank picks the same experts (which expert
        # parallelism needs); the routed and shared partial sums share one all-reduce
        weights, ids = self.route(x)
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return tensor_model_parallel_all_reduce(out)


def deepseek_layer(config: Any, layer_idx: int, version: int, interleaved_rope: bool) -> PreNormDecoderLayer:
    """The standard pre-norm layer around MLA; its MLP is dense for the first
    ``first_k_dense_replace`` layers, the MoE after them."""
    if layer_idx >= (getattr(config, "first_k_dense_replace", 0) or 0):
        mlp = DeepseekMoE(config, version)
    else:
        mlp = DeepseekMLP(config.hidden_size, config.intermediate_size)
    return PreNormDecoderLayer(DeepseekMLA(config, interleaved_rope), mlp, config.hidden_size, config.rms_norm_eps)


class _DeepseekForCausalLM(CausalLM):
    version = 2

    def __init__(self, config: Any) -> None:
        if getattr(config, "mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported by core-runner-deepseek")
        if (getattr(config, "hidden_act", "silu") or "silu") != "silu":
            raise ValueError(f"hidden_act={config.hidden_act!r} is not supported: only 'silu'")
        interleaved = True if self.version == 2 else bool(getattr(config, "rope_interleave", True))
        super().__init__(config, DecoderStack(config, lambda cfg, i: deepseek_layer(cfg, i, self.version, interleaved)))
        # per-expert checkpoint tensors first (first match wins), then the dense MLPs' gate/up;
        # no q/k/v packing: MLA's q_proj is a module of its own
        self.packed_modules_mapping = {
            **expert_packed_mapping(config.n_routed_experts),
            "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
        }
        # multi-token-prediction layers (V3 checkpoints) are not used for plain decoding
        mtp = rf"^model\.layers\.({'|'.join(str(config.num_hidden_layers + i) for i in range(8))})\."
        self.ignored_weight_patterns = (*self.ignored_weight_patterns, mtp)


class DeepseekV2ForCausalLM(_DeepseekForCausalLM):
    version = 2


class DeepseekV3ForCausalLM(_DeepseekForCausalLM):
    version = 3
