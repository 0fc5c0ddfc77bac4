"""The fused MoE layer: routed experts with stacked weights, usable by any plugin.

Weights are stacked per expert: ``w13.weight`` [E, 2I, H] (gate rows, then up rows) and
``w2.weight`` [E, H, I]; with ``has_bias`` also ``w13.bias`` [E, 2I] and ``w2.bias`` [E, H].
Checkpoints come in two shapes:

- one tensor per expert (``experts.{e}.gate_proj/up_proj/down_proj.weight``, Mixtral /
  Qwen-MoE / DeepSeek): ``expert_packed_mapping`` gives the entries a model puts in front
  of its ``packed_modules_mapping`` so that the loader routes each of them into its slice
  with the shard id ``(expert, "gate"|"up"|"down")``;
- stacked tensors, loaded whole (shard id None) in the layout ``checkpoint_layout`` names:
  ``"linear"`` is the parameters' own ([E, 2I, H] gate rows then up rows, [E, H, I]);
  ``"transposed_interleaved"`` is Hugging Face gpt-oss's (``gate_up_proj`` [E, H, 2I] whose
  columns alternate gate, up, gate, up, ...; ``down_proj`` [E, I, H]; ``gate_up_proj_bias``
  [E, 2I] interleaved the same way). ``stacked_expert_name`` renames those checkpoint
  names to the parameters'. Interleaved gate/up are split apart when loaded (vLLM keeps
  them interleaved for its gpt-oss kernels), so every activation reads [gate | up].

``forward(hidden [T, H], topk_weights [T, k], topk_ids [T, k]) -> [T, H]`` computes
sum_k w_k * (down_e(act(gate_e(x) + b_gate, up_e(x) + b_up)) + b_down) with the
``activation`` (vLLM's names):

- ``"silu"`` (default): silu(gate) * up;
- ``"swigluoai"`` (gpt-oss): gate = min(gate, limit), up = clamp(up, -limit, limit),
  (up + 1) * gate * sigmoid(alpha * gate), with ``swiglu_alpha`` (1.702) and
  ``swiglu_limit`` (7.0).

Routing (the ids and weights) is the caller's: see ``core_runner.layers.moe_routing``.
The torch reference (a loop over the experts) runs on the CPU / torch backend; the Triton
grouped GEMM (``core_runner.kernels.fused_moe_triton``, biases added inside both GEMMs and
the activation in its own kernel) runs where the other layers' Triton kernels do
(``forward_context.use_triton_kernels``).

Across the tensor-parallel ranks (``core_runner.distributed``) the experts are split one
of two ways, and either way each rank computes a partial sum of the output:

- tensor parallel (the default when tp > 1): every rank holds every expert with 1/tp of
  its intermediate dimension, rows [r I/tp, (r+1) I/tp) of gate and of up (and of their
  biases) and the same columns of down. Both activations are elementwise in that
  dimension, so rank r's down product is the sum over its slice of the intermediate
  units. The down bias is whole on every rank and added by rank 0 only, so the all-reduce
  sums it once.
- expert parallel (``expert_parallel_enabled()``, the engine's enable_expert_parallel):
  rank r holds experts [r E/tp, (r+1) E/tp) whole, biases included; a (token, expert) pair
  routed to another rank's expert contributes nothing here. Routing must then be
  identical on every rank (a replicated router over replicated hidden states gives that).

``reduce_results=True`` all-reduces the partial sums; with False the caller does, e.g.
after adding a shared expert's own partial sum so that one all-reduce serves both.
Parameters hold the rank's part: w13 [E_local, 2 I_local, H], w2 [E_local, H, I_local].
Shard ids keep global expert ids: the loader skips other ranks' experts, and
``param.shard_ids`` lists this rank's only, so loading requires exactly those.

Built for an fp8 checkpoint (``core_runner.layers.fp8_weight``), ``w13`` / ``w2`` keep
their weights as float8_e4m3fn with block scales per expert (``weight_scale_inv``
[E_local, ceil(rows / b0), ceil(cols / b1)]); the up part starts at row I_local, which must
be a multiple of b0 (else the loader keeps the layer dense, with a warning). The Triton
path multiplies them with the fp8 grouped GEMM (``kernels.fused_moe_fp8_triton``: W8A8,
activations quantized per token and group of b1, biases and both activations supported);
the torch path dequantizes the layer's experts per call, computing with exactly the
checkpoint's values. When only one of w13 / w2 stayed fp8 both take the dequantizing
path. Whole stacked checkpoint tensors (gpt-oss's layout) are dequantized at load.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.distributed import (
    divide,
    expert_parallel_enabled,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from core_runner.layers.fp8_weight import _load_rows, _make_fp8_resident, _to_dense, dense_weight, is_fp8
from core_runner.layers.linear import copy_into, materialize

ACTIVATIONS = ("silu", "swigluoai")
CHECKPOINT_LAYOUTS = ("linear", "transposed_interleaved")
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt-oss's (and vLLM's fixed) values
# Hugging Face stacked-expert parameter names (gpt-oss) -> this layer's
STACKED_EXPERT_NAMES = {"gate_up_proj": "w13.weight", "gate_up_proj_bias": "w13.bias", "down_proj": "w2.weight",
                        "down_proj_bias": "w2.bias"}


def _check_activation(activation: str, swiglu_alpha: float, swiglu_limit: float) -> None:
    """ValueError naming the option when the activation is unknown or its constants are not numbers."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported by FusedMoE: expected one of {ACTIVATIONS}")
    for name, value in (("swiglu_alpha", swiglu_alpha), ("swiglu_limit", swiglu_limit)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(f"{name}={value!r}: expected a number")


def swigluoai_ref(gate: torch.Tensor, up: torch.Tensor, alpha: float = SWIGLU_ALPHA,
                  limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU, as transformers computes it: gate clamped above at
    ``limit``, up to [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def fused_moe_ref(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None, activation: str = "silu",
    swiglu_alpha: float = SWIGLU_ALPHA, swiglu_limit: float = SWIGLU_LIMIT,
    quantize_act: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Loop over experts; float32 accumulation of the weighted expert outputs. Ids outside
    [0, E) (an expert-parallel layer marks other ranks' experts -1) contribute nothing.
    ``w13_bias`` [E, 2I] is added to gate/up, ``w2_bias`` [E, H] to each expert's output
    before its router weight scales it. ``quantize_act`` (rows -> rows) replaces the
    activation before the down product: the fp8 reference's quantize-dequantize
    (``layers.fused_moe_fp8``)."""
    _check_activation(activation, swiglu_alpha, swiglu_limit)
    num_tokens, hidden_size = hidden.shape
    out = torch.zeros((num_tokens, hidden_size), dtype=torch.float32, device=hidden.device)
    ids = topk_ids.long()
    for e in range(w13.shape[0]):
        tok, slot = torch.where(ids == e)
        if tok.numel() == 0:
            continue
        gate, up = F.linear(hidden[tok], w13[e], None if w13_bias is None else w13_bias[e]).chunk(2, dim=-1)
        act = F.silu(gate) * up if activation == "silu" else swigluoai_ref(gate, up, swiglu_alpha, swiglu_limit)
        if quantize_act is not None:
            act = quantize_act(act)
        y = F.linear(act, w2[e], None if w2_bias is None else w2_bias[e])
        out.index_add_(0, tok, y.float() * topk_weights[tok, slot].float().unsqueeze(-1))
    return out.to(hidden.dtype)


def expert_packed_mapping(num_experts: int, prefix: str = "experts") -> dict[str, tuple[str, tuple[int, str]]]:
    """``packed_modules_mapping`` entries for per-expert HF tensors of a FusedMoE named
    ``prefix`` (put them before generic "gate_proj"/"up_proj" entries: first match wins);
    their ``.bias`` tensors route the same way."""
    mapping: dict[str, tuple[str, tuple[int, str]]] = {}
    for e in range(num_experts):
        mapping[f"{prefix}.{e}.gate_proj"] = (f"{prefix}.w13", (e, "gate"))
        mapping[f"{prefix}.{e}.up_proj"] = (f"{prefix}.w13", (e, "up"))
        mapping[f"{prefix}.{e}.down_proj"] = (f"{prefix}.w2", (e, "down"))
    return mapping


def stacked_expert_name(name: str, prefix: str = "experts") -> str:
    """A checkpoint name of Hugging Face's stacked experts (``...{prefix}.gate_up_proj``,
    ``_bias``, ``down_proj``, ``_bias``) as this layer's parameter name (``...{prefix}.w13.weight``
    ...); any other name unchanged. For a model's ``map_weight_name``."""
    head, _, last = name.rpartition(".")
    if last in STACKED_EXPERT_NAMES and (head == prefix or head.endswith("." + prefix)):
        return f"{head}.{STACKED_EXPERT_NAMES[last]}"
    return name


class _StackedExpertWeight(nn.Module):
    """One stacked parameter ``weight`` [len(experts), parts * rows, cols] (and, with
    ``bias``, ``bias`` [len(experts), parts * rows]): this rank's experts (global ids
    ``experts``), each the concatenation of its ``shards`` parts.

    ``part_shape`` is one part's checkpoint shape (an expert's gate, up or down matrix);
    tensor parallelism keeps 1/``tp_parts`` of its ``split_dim`` (0: gate/up rows, 1:
    down columns), the slice of ``tp_rank``; a bias is split with the rows (split_dim 0)
    and whole otherwise. ``layout`` is the shape a whole stacked checkpoint tensor has
    (the module docstring)."""

    def __init__(self, num_experts: int, experts: range, part_shape: tuple[int, int], shards: tuple[str, ...],
                 split_dim: int, tp_rank: int, tp_parts: int, bias: bool = False, layout: str = "linear") -> None:
        super().__init__()
        self.num_experts, self.experts, self.shards = num_experts, experts, shards
        self.part_shape, self.split_dim, self.tp_rank, self.tp_parts = part_shape, split_dim, tp_rank, tp_parts
        self.layout = layout
        local = list(part_shape)
        local[split_dim] //= tp_parts
        self.local_part = tuple(local)
        self.shard_rows = local[0]
        # the loader requires every (expert, part) slice of this rank's experts (or the
        # whole stacked tensor); other ranks' expert tensors are skipped, not required
        ids = tuple((e, s) for e in experts for s in shards)
        self.weight = nn.Parameter(torch.empty(len(experts), local[0] * len(shards), local[1]), requires_grad=False)
        self.weight.weight_loader, self.weight.shard_ids = self.weight_loader, ids
        if bias:
            self.bias = nn.Parameter(torch.empty(len(experts), local[0] * len(shards)), requires_grad=False)
            self.bias.weight_loader, self.bias.shard_ids = self.weight_loader, ids
        else:
            self.register_parameter("bias", None)
        self.fp8_block = None
        if layout == "linear":
            _make_fp8_resident(self, self.weight)

    def _split(self, loaded, dim: int, is_bias: bool):
        """This rank's tensor-parallel slice of ``loaded`` along ``dim`` (a bias is split
        only with the rows)."""
        if self.tp_parts == 1 or (is_bias and self.split_dim != 0):
            return loaded
        n = self.local_part[self.split_dim]
        return loaded.narrow(dim, self.tp_rank * n, n)

    def _load_stacked(self, param: nn.Parameter, loaded, is_bias: bool) -> None:
        """An already stacked tensor of every expert, in ``self.layout``."""
        rows, cols = self.part_shape
        parts = len(self.shards)
        transposed = self.layout == "transposed_interleaved"
        if is_bias:
            full = (self.num_experts, rows * parts)
        else:
            full = (self.num_experts, cols, rows * parts) if transposed else (self.num_experts, rows * parts, cols)
        if tuple(loaded.shape) != full:
            raise ValueError(f"stacked expert {'bias' if is_bias else 'tensor'} has shape {tuple(loaded.shape)}, "
                             f"expected {full} (checkpoint_layout {self.layout!r})")
        if len(self.experts) != self.num_experts:
            loaded = loaded.narrow(0, self.experts.start, len(self.experts))
        if not transposed:
            for i, part in enumerate(self.shards):
                src = self._split(loaded.narrow(1, i * rows, rows), self.split_dim + 1, is_bias)
                copy_into(param.data.narrow(1, i * self.shard_rows, self.shard_rows), src,
                          f"stacked experts, part {part!r}")
            return
        # the output dim is last; its parts alternate, so a rank's rows [r n, (r+1) n)
        # of every part are the contiguous columns [parts r n, parts (r+1) n)
        out_dim = len(loaded.shape) - 1
        if self.tp_parts > 1 and self.split_dim == 0:
            n = self.shard_rows
            loaded = loaded.narrow(out_dim, parts * self.tp_rank * n, parts * n)
        elif self.tp_parts > 1 and not is_bias:
            loaded = loaded.narrow(1, self.tp_rank * self.local_part[1], self.local_part[1])
        t = materialize(loaded)
        for i, part in enumerate(self.shards):
            src = t[..., i::parts]
            copy_into(param.data.narrow(1, i * self.shard_rows, self.shard_rows),
                      src if is_bias else src.transpose(1, 2), f"stacked experts, part {part!r}")

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        is_bias = param is self.bias
        if shard_id is None:
            if not is_bias:
                _to_dense(self)
            return self._load_stacked(param, loaded, is_bias)
        if (not isinstance(shard_id, tuple) or len(shard_id) != 2 or shard_id[1] not in self.shards
                or not 0 <= int(shard_id[0]) < self.num_experts):
            raise ValueError(f"expert shard {shard_id!r} is invalid: expected (0..{self.num_experts - 1}, "
                             f"one of {self.shards})")
        e, part = int(shard_id[0]), self.shards.index(shard_id[1])
        if e not in self.experts:
            return  # another rank's expert (expert parallel)
        what = f"expert {e} {shard_id[1]}{' bias' if is_bias else ''}"
        want = self.part_shape[:1] if is_bias else self.part_shape
        if tuple(loaded.shape) != want:
            raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, expected {want}")
        if is_bias:
            dst = param.data[e - self.experts.start].narrow(0, part * self.shard_rows, self.shard_rows)
            return copy_into(dst, self._split(loaded, self.split_dim, is_bias), what)
        _load_rows(self, param, part * self.shard_rows, self.shard_rows, self._split(loaded, self.split_dim, False),
                  what, index=e - self.experts.start)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The stacked weight in ``dtype`` (dequantized per call when it is fp8)."""
        return dense_weight(self, dtype) if is_fp8(self) else self.weight


class FusedMoE(nn.Module):
    """Routed experts (gated MLPs) with stacked weights; see the module docstring.

    ``num_experts`` / ``intermediate_size`` are the checkpoint's (global) sizes. ``impl``
    picks the kernel ("auto": Triton where the step runs Triton kernels).
    ``reduce_results`` (used with tp > 1): all-reduce the ranks' partial sums here
    (True), or return this rank's partial sum for the caller to reduce (False). Under
    expert parallelism ``num_experts`` must divide by tp (ValueError naming it);
    otherwise ``intermediate_size`` must. ``has_bias`` adds per-expert gate/up and down
    biases; ``activation`` is "silu" or "swigluoai" (with ``swiglu_alpha`` /
    ``swiglu_limit``); ``checkpoint_layout`` the shape of whole stacked checkpoint tensors
    ("linear" or "transposed_interleaved")."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, impl: str = "auto",
                 reduce_results: bool = True, *, has_bias: bool = False, activation: str = "silu",
                 swiglu_alpha: float = SWIGLU_ALPHA, swiglu_limit: float = SWIGLU_LIMIT,
                 checkpoint_layout: str = "linear") -> None:
        super().__init__()
        if impl not in ("auto", "torch", "triton"):
            raise ValueError(f"impl={impl!r} is invalid: expected 'auto', 'torch' or 'triton'")
        _check_activation(activation, swiglu_alpha, swiglu_limit)
        if checkpoint_layout not in CHECKPOINT_LAYOUTS:
            raise ValueError(f"checkpoint_layout={checkpoint_layout!r} is invalid: expected one of "
                             f"{CHECKPOINT_LAYOUTS}")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.impl, self.reduce_results = impl, reduce_results
        self.has_bias, self.activation = bool(has_bias), activation
        self.swiglu_alpha, self.swiglu_limit = float(swiglu_alpha), float(swiglu_limit)
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.expert_parallel = expert_parallel_enabled()
        if self.expert_parallel:
            self.local_num_experts = divide(num_experts, self.tp_size, "num_experts")
            self.intermediate_size_per_partition, tp_parts = intermediate_size, 1
        else:
            self.local_num_experts = num_experts
            self.intermediate_size_per_partition = divide(intermediate_size, self.tp_size, "moe_intermediate_size")
            tp_parts = self.tp_size
        self.expert_start = self.tp_rank * self.local_num_experts if self.expert_parallel else 0
        experts = range(self.expert_start, self.expert_start + self.local_num_experts)
        self.w13 = _StackedExpertWeight(num_experts, experts, (intermediate_size, hidden_size), ("gate", "up"),
                                        0, self.tp_rank, tp_parts, has_bias, checkpoint_layout)
        self.w2 = _StackedExpertWeight(num_experts, experts, (hidden_size, intermediate_size), ("down",),
                                       1, self.tp_rank, tp_parts, has_bias, checkpoint_layout)
        # the down bias is whole on every rank: one rank adds it, so the all-reduce sums it once
        self.adds_down_bias = self.has_bias and (self.expert_parallel or self.tp_rank == 0)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, intermediate_size="
                f"{self.intermediate_size}, activation={self.activation!r}, has_bias={self.has_bias}")

    def _use_triton(self, hidden: torch.Tensor) -> bool:
        if self.impl != "auto":
            return self.impl == "triton"
        from core_runner.forward_context import use_triton_kernels

        return use_triton_kernels(hidden)

    def local_expert_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's stacked index, -1 for another rank's expert."""
        if not self.expert_parallel:
            return topk_ids
        local = topk_ids - self.expert_start
        return torch.where((local >= 0) & (local < self.local_num_experts), local, -1)

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        ids = self.local_expert_ids(topk_ids)
        extra = {}
        if self.has_bias:
            extra.update(w13_bias=self.w13.bias, w2_bias=self.w2.bias if self.adds_down_bias else None)
        if self.activation != "silu":
            extra.update(activation=self.activation, swiglu_alpha=self.swiglu_alpha, swiglu_limit=self.swiglu_limit)
        use_triton = self._use_triton(hidden)
        if use_triton and is_fp8(self.w13) and is_fp8(self.w2):
            from core_runner.kernels.fused_moe_fp8_triton import fused_moe_fp8_triton

            out = fused_moe_fp8_triton(hidden, self.w13.weight, self.w13.weight_scale_inv, self.w2.weight,
                                       self.w2.weight_scale_inv, self.w13.fp8_block, topk_weights, ids,
                                       skip_invalid_ids=self.expert_parallel, **extra)
        elif use_triton:
            from core_runner.kernels.fused_moe_triton import fused_moe_triton

            out = fused_moe_triton(hidden, self.w13.dense(hidden.dtype), self.w2.dense(hidden.dtype), topk_weights,
                                   ids, skip_invalid_ids=self.expert_parallel, **extra)
        else:
            out = fused_moe_ref(hidden, self.w13.dense(hidden.dtype), self.w2.dense(hidden.dtype), topk_weights, ids,
                                **extra)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out
