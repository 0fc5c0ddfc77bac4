"""GraniteMoeHybridForCausalLM from core_runner.layers: Mamba2 mixers and attention
layers per ``config.layer_types``, a shared MLP plus an optional top-k MoE in every
layer, NoPE or RoPE attention, and Granite's four scalar multipliers.

Under tensor parallelism each rank keeps 1/tp of the attention and Mamba heads, of the
shared MLP's and of every expert's intermediate dimension (or, with expert parallelism,
1/tp of the experts whole), and of the vocabulary; the router is replicated. A layer's
shared-MLP and expert outputs are partial sums, added and all-reduced once."""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.layers import (
    Attention,
    Mamba2Mixer,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
    copy_into,
    default_weight_loader,
    divide,
    expert_parallel_enabled,
    get_rope,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
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


class GraniteAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        h = config.hidden_size
        total_heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or h // total_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(h, self.head_dim, total_heads, config.num_key_value_heads or total_heads,
                                          bias=bias)
        # this rank's heads
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, h, bias=bias)
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
    """input_linear -> [gate | up] -> silu(gate) * up -> output_linear (HF names). The
    checkpoint's one input_linear tensor stacks gate and up; each rank keeps its slice of
    both. Without ``reduce_results`` the output is this rank's partial sum."""

    def __init__(self, hidden: int, intermediate: int, act: str, reduce_results: bool = True) -> None:
        super().__init__()
        if act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={act!r} is not supported: expected 'silu'")
        self.input_linear = MergedColumnParallelLinear(hidden, [intermediate, intermediate])
        self.output_linear = RowParallelLinear(intermediate, hidden, reduce_results=reduce_results)
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
    """Expert weights stacked as in the HF checkpoint: gate_up_proj [E, 2I, H], down_proj
    [E, H, I]. Under tensor parallelism each rank keeps its 1/tp of every expert's I (the
    matching rows of gate and of up, columns of down); with expert parallelism it keeps
    1/tp of the experts whole instead. Either way ``forward`` returns this rank's partial
    sum."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.num_experts, self.intermediate = num_experts, intermediate
        if expert_parallel_enabled():
            self.num_local = divide(num_experts, tp, "num_local_experts (split by expert parallelism)")
            self.expert_start, self.slice_index, local = rank * self.num_local, 0, intermediate
        else:
            self.num_local, self.expert_start, self.slice_index = num_experts, 0, rank
            local = divide(intermediate, tp, "intermediate_size (of each expert)")
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_local, 2 * local, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(self.num_local, hidden, local), requires_grad=False)
        self.gate_up_proj.weight_loader = self._load_gate_up
        self.down_proj.weight_loader = self._load_down

    def _mine(self, loaded, shard_id: object, what: str, shape: tuple[int, ...]):
        """This rank's experts of a checkpoint tensor holding all of them (checked first)."""
        if shard_id is not None:
            raise ValueError(f"experts.{what} is not fused; got shard {shard_id!r}")
        if tuple(loaded.shape) != shape:
            raise ValueError(f"experts.{what}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {shape}")
        return loaded.narrow(0, self.expert_start, self.num_local)

    def _load_gate_up(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        loaded = self._mine(loaded, shard_id, "gate_up_proj", (self.num_experts, 2 * self.intermediate, param.shape[2]))
        n = param.shape[1] // 2
        for half, name in enumerate(("gate", "up")):
            first = half * self.intermediate + self.slice_index * n
            copy_into(param.data.narrow(1, half * n, n), loaded.narrow(1, first, n), f"experts.gate_up_proj {name}")

    def _load_down(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        loaded = self._mine(loaded, shard_id, "down_proj", (self.num_experts, param.shape[1], self.intermediate))
        n = param.shape[2]
        copy_into(param.data, loaded.narrow(2, self.slice_index * n, n), "experts.down_proj columns")

    def _expert(self, local: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_proj[local]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[local])

    def forward(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        if x.device.type == "cuda":
            # no data-dependent shapes (graph safe, no host sync): every expert sees every
            # token, weighted by its routing weight (zero where it was not chosen)
            for local in range(self.num_local):
                w = (weights * (idx == self.expert_start + local)).sum(dim=-1, keepdim=True)
                out += self._expert(local, x) * w
            return out
        for e in idx.unique().tolist():
            local = e - self.expert_start
            if not 0 <= local < self.num_local:  # another rank's expert
                continue
            tok, slot = torch.where(idx == e)
            out.index_add_(0, tok, self._expert(local, x[tok]) * weights[tok, slot, None])
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
        has_moe = (config.num_local_experts or 0) > 0
        # with experts, the shared MLP's partial sum joins theirs in one all-reduce
        self.shared_mlp = SharedMLP(h, config.shared_intermediate_size, config.hidden_act, reduce_results=not has_moe)
        self.block_sparse_moe = SparseMoE(config) if has_moe else None
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        h = self.mamba(h) if self.kind == "mamba" else self.self_attn(positions, h)
        x = x + h * self.residual_multiplier
        h = self.post_attention_layernorm(x)
        m = self.shared_mlp(h)
        if self.block_sparse_moe is not None:
            m = tensor_model_parallel_all_reduce(self.block_sparse_moe(h) + m)
        return x + m * self.residual_multiplier


class GraniteHybridModel(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
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
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, self.model.embed_tokens if tied else None)
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
