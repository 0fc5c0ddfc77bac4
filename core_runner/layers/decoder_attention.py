"""The rotary self-attention block of GQA decoders: one fused q/k/v projection, optional
per-head q/k norms, RoPE, paged ``Attention``, then the output projection.

Families differ only in options, so each passes what it needs rather than copying the
block: q/k/v/o biases, a q/k norm class, the softmax scale, a sliding window, a score
soft cap, learned per-head sinks, the RoPE's layer type / length / rotated width, or no
RoPE at all. Parameter names are the Hugging Face checkpoints' (``qkv_proj`` packed from
``q_proj`` / ``k_proj`` / ``v_proj``, ``o_proj``, ``q_norm``, ``k_norm``, ``sinks``).

Under tensor parallelism (vLLM's split) each rank holds num_attention_heads / tp query
heads and num_key_value_heads / tp KV heads (one KV head, replicated, when tp exceeds
their count); q/k/v are column-parallel, o_proj row-parallel (one all-reduce, its bias
added once), q/k norms act per head so they are whole on every rank, and the sinks are
this rank's heads' slice.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from core_runner.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from core_runner.layers.attention import Attention
from core_runner.layers.linear import QKVParallelLinear, RowParallelLinear, check_head_split, copy_into
from core_runner.layers.rotary import get_rope


class DecoderAttention(nn.Module):
    """``forward(positions [T], x [T, input_size]) -> [T, hidden]``.

    Head counts and sizes come from the HF config (``num_attention_heads``,
    ``num_key_value_heads`` (default: as many as the query heads), ``head_dim`` (default
    hidden_size / heads)); the options:

    - ``input_size``: the width q/k/v read (hidden_size by default);
    - ``bias``: q/k/v/o biases (default: the config's ``attention_bias``, else none);
    - ``qk_norm``: a norm class built as ``qk_norm(head_dim, config.rms_norm_eps)`` and
      applied per head to q and k before RoPE (None: no q/k norm);
    - ``scale``: the softmax scale (default head_dim ** -0.5);
    - ``sliding_window``, ``logits_soft_cap``: ``Attention``'s options;
    - ``sinks``: learn one sink logit per head (``sinks`` parameter, [num_attention_heads]
      in the checkpoint) that joins each softmax denominator;
    - ``rope``: False skips RoPE (NoPE layers); ``rope_layer_type``, ``max_position`` and
      ``rotary_dim`` go to ``get_rope``.
    """

    def __init__(self, config: Any, *, input_size: int | None = None, bias: bool | None = None,
                 qk_norm: Callable[[int, float], nn.Module] | None = None, scale: float | None = None,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None, sinks: bool = False,
                 rope: bool = True, rope_layer_type: str | None = None, max_position: int | None = None,
                 rotary_dim: int | None = None) -> None:
        super().__init__()
        hidden, total_heads = config.hidden_size, config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        check_head_split(total_heads, total_kv_heads)
        self.head_dim = getattr(config, "head_dim", None) or hidden // total_heads
        if bias is None:
            bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(input_size or hidden, self.head_dim, total_heads, total_kv_heads, bias=bias)
        # this rank's share of the heads (all of them with one rank)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = qk_norm(self.head_dim, config.rms_norm_eps) if qk_norm is not None else None
        self.k_norm = qk_norm(self.head_dim, config.rms_norm_eps) if qk_norm is not None else None
        self.rotary_emb = (get_rope(config, self.head_dim, rotary_dim=rotary_dim, max_position=max_position,
                                    layer_type=rope_layer_type) if rope else None)
        self.sinks: nn.Parameter | None = None
        if sinks:
            self.tp_rank = get_tensor_model_parallel_rank()
            # Attention reads this tensor at every forward; this module owns and loads it
            self.sinks = nn.Parameter(torch.empty(self.num_heads), requires_grad=False)
            self.sinks.weight_loader = self.load_sinks
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim,
                              self.head_dim**-0.5 if scale is None else scale,
                              sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, sinks=self.sinks)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim

    def load_sinks(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        """The checkpoint's sinks [num_attention_heads]: this rank's heads' slice."""
        if shard_id is not None:
            raise ValueError(f"sinks are not fused; got shard {shard_id!r}")
        n = param.shape[0]
        total = n * get_tensor_model_parallel_world_size()
        if tuple(loaded.shape) != (total,):
            raise ValueError(f"sinks have shape {tuple(loaded.shape)}, expected ({total},): one logit per head")
        copy_into(param.data, loaded.narrow(0, self.tp_rank * n, n) if total != n else loaded,
                  f"sinks (rank {self.tp_rank}'s heads)")

    load_sinks.accepts_checkpoint_slices = True  # reads only through .shape / .narrow / copy_into

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))
