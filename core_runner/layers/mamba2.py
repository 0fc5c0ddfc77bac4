"""The Mamba2 mixer: in_proj, causal depthwise conv with per-row state, selective scan
(dt bias + softplus, A = -exp(A_log), D skip), gated grouped RMSNorm, out_proj.

The layer processes a ragged batch: several requests' chunks concatenated per
``query_start_loc``. Its recurrent state lives in two per-request-row tensors declared
through ``kv_cache_spec`` (a ``RowStateSpec``) and bound by the runner as
``self.kv_cache = (conv_state [rows, K - 1, conv_dim], ssm_state [rows, H, P, N])``, plus,
with speculative decoding, the verification scratch (``kernels/mamba_verify.py``;
``meta["verify"]`` marks a verification step).
What it needs per step comes from the forward context, ``attn_metadata.extra["mamba"]``
(filled by a ModelState such as ``model_states.mamba_hybrid``):

- ``state_rows`` / ``state_rows_cpu``: the state row of each request (padded entries
  point at the scratch row),
- ``has_initial_state`` / ``has_initial_state_cpu``: whether a request continues from
  saved state (tokens already computed), else it starts from zeros,
- ``query_start_loc`` / ``query_start_loc_cpu``,
- ``write_state``: False for dummy runs, which must leave every row untouched.

Under tensor parallelism (vLLM's split) each rank keeps 1/tp of the heads: its slice of
z, x, dt, A_log, D, dt_bias and of the norm's channels, and of B and C either 1/tp of
the groups (n_groups % tp == 0) or the one group its heads read (tp % n_groups == 0,
e.g. the common n_groups=1: B and C replicated). in_proj and conv1d hold the rank's
parts of their packed x | B | C (and z, dt) channels, the row state is sized by them, so
each rank keeps the state of its own heads, and out_proj is row-parallel (all-reduce).

With kernels='triton' (``use_triton_kernels``; the attention backend does not matter)
the conv, scan and gated norm run as Triton kernels (graph safe; steps with prefill tokens
use the chunk-parallel scan of ``kernels.mamba_ssd_triton``); otherwise the torch references
in ``core_runner.kernels.mamba`` run one request at a time.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.distributed import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from core_runner.forward_context import get_forward_context, use_triton_kernels
from core_runner.kv_cache_spec import RowStateSpec
from core_runner.layers.fp8_weight import _load_rows, is_fp8
from core_runner.layers.linear import Linear, RowParallelLinear, copy_into

# (rows of the part in the checkpoint tensor, first of them this rank keeps, rows kept)
Part = tuple[int, int, int]


def _load_parts(dst: torch.Tensor, loaded, parts: list[Part], what: str) -> None:
    """Copy this rank's slices of a checkpoint tensor that stacks ``parts`` along dim 0
    into ``dst``, stacked in the same order. ``loaded`` is a tensor or a lazy slice: only
    its ``shape`` and ``narrow`` are used before ``copy_into``."""
    total = sum(p[0] for p in parts)
    if loaded.shape[0] != total or tuple(loaded.shape[1:]) != tuple(dst.shape[1:]):
        raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, expected "
                         f"{(total, *dst.shape[1:])}")
    src = out = 0
    for i, (full, first, rows) in enumerate(parts):
        copy_into(dst.narrow(0, out, rows), loaded.narrow(0, src + first, rows), f"{what} part {i}")
        src, out = src + full, out + rows


def _parts_loader(parts: list[Part], what: str):
    """A ``weight_loader`` that keeps this rank's ``parts`` (see ``_load_parts``)."""

    def loader(param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is not None:
            raise ValueError(f"{what} is not fused; got shard {shard_id!r}")
        _load_parts(param.data, loaded, parts, what)

    return loader


def _rank_part(total: int, tp: int, rank: int, what: str) -> Part:
    """The rank's contiguous 1/tp of ``total`` rows."""
    n = divide(total, tp, what)
    return total, rank * n, n


class GatedRMSNorm(nn.Module):
    """y * silu(z), then RMS-normalised within groups of ``group_size`` channels, times weight
    (the gate is applied before the normalisation, as in GraniteMoeHybrid / Mamba2 HF).

    With ``split`` the layer holds this rank's 1/tp of the ``hidden_size`` channels (as a
    column-parallel layer leaves y and z). Groups inside one rank normalise locally; a
    group spread over several ranks gets its mean square from an all-reduce of the
    ranks' sums of squares."""

    def __init__(self, hidden_size: int, group_size: int, eps: float = 1e-6, *, split: bool = False) -> None:
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"hidden_size={hidden_size} is not a multiple of group_size={group_size}")
        tp = get_tensor_model_parallel_world_size() if split else 1
        rank = get_tensor_model_parallel_rank() if split else 0
        part = _rank_part(hidden_size, tp, rank, "gated norm hidden_size")
        local = part[2]
        if local % group_size and group_size % local:
            raise ValueError(f"gated norm: a rank's {local} channels and group_size={group_size} do not align "
                             f"(hidden_size={hidden_size}, tensor_parallel_size={tp}); one must divide the other")
        self.group_size, self.eps = group_size, eps
        self.num_groups = hidden_size // group_size
        # a group spread over ranks: this rank's channels are part of group ``self.group``
        self.spans_ranks = local % group_size != 0
        self.group = part[1] // group_size
        self.weight = nn.Parameter(torch.ones(local), requires_grad=False)
        self.weight.weight_loader = _parts_loader([part], "gated norm weight")

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if (not self.spans_ranks and use_triton_kernels(z) and y.dim() == 2 and y.shape == z.shape
                and y.stride(-1) == 1 and z.stride(-1) == 1):
            from core_runner.kernels.gated_rms_norm_triton import gated_rms_norm_triton

            return gated_rms_norm_triton(y, z, self.weight, self.group_size, self.eps)
        return self.norm_ref(y, z)

    def norm_ref(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The torch path (the CPU's, a group spread over ranks, and the kernel's reference)."""
        dtype = z.dtype
        h = y.float() * F.silu(z.float())
        if self.spans_ranks:
            # a slot per group so that ranks holding other groups add nothing to this one
            sums = h.new_zeros(*h.shape[:-1], self.num_groups)
            sums[..., self.group] = h.pow(2).sum(-1)
            mean_sq = tensor_model_parallel_all_reduce(sums)[..., self.group, None] / self.group_size
            return self.weight * (h * torch.rsqrt(mean_sq + self.eps)).to(dtype)
        g = h.view(*h.shape[:-1], -1, self.group_size)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view(h.shape).to(dtype)


class DepthwiseConv1d(nn.Module):
    """Holds the conv parameters in the HF layout: weight [C, 1, K], bias [C]. With
    ``parts`` (see ``_load_parts``) the C channels are the rank's slices of the
    checkpoint's packed channels."""

    def __init__(self, channels: int, kernel_size: int, bias: bool, parts: list[Part] | None = None) -> None:
        super().__init__()
        parts = parts or [(channels, 0, channels)]
        if sum(p[2] for p in parts) != channels:
            raise ValueError(f"conv1d: parts {parts} keep {sum(p[2] for p in parts)} channels, expected {channels}")
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size), requires_grad=False)
        self.weight.weight_loader = _parts_loader(parts, "conv1d weight")
        if bias:
            self.bias = nn.Parameter(torch.empty(channels), requires_grad=False)
            self.bias.weight_loader = _parts_loader(parts, "conv1d bias")
        else:
            self.register_parameter("bias", None)


class _PackedColumnLinear(Linear):
    """A linear layer whose output rows are the rank's ``parts`` of a checkpoint matrix
    packed from several projections (Mamba's in_proj: z | x | B | C | dt), each part
    split or replicated on its own terms."""

    def __init__(self, in_features: int, parts: list[Part], bias: bool = False, what: str = "in_proj") -> None:
        self.parts, self.what = parts, what
        super().__init__(in_features, sum(p[2] for p in parts), bias)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id: object = None) -> None:
        if shard_id is not None:
            raise ValueError(f"{self.what} is not fused; got shard {shard_id!r}")
        if param is not self.weight or not is_fp8(self):
            return _load_parts(param.data, loaded, self.parts, self.what)
        # fp8: each part keeps its own block scales, so each must start on a block of rows
        # (_load_rows turns the layer dense, with a warning, where one does not)
        total = sum(p[0] for p in self.parts)
        if loaded.shape[0] != total or tuple(loaded.shape[1:]) != tuple(param.shape[1:]):
            raise ValueError(f"{self.what}: checkpoint tensor has shape {tuple(loaded.shape)}, expected "
                             f"{(total, *param.shape[1:])}")
        src = out = 0
        for i, (full, first, rows) in enumerate(self.parts):
            _load_rows(self, param, out, rows, loaded.narrow(0, src + first, rows), f"{self.what} part {i}")
            src, out = src + full, out + rows

    weight_loader.fp8_aware = True


class Mamba2Mixer(nn.Module):
    """The Mamba2 block (see the module docstring): ``forward(hidden [T, hidden_size])`` runs
    in_proj, the causal conv and the selective scan from each request's saved state (or
    zeros), updates that state (except in dummy runs), applies the gated RMSNorm and
    returns out_proj of it, [T, hidden_size]. ``kv_cache_spec`` declares the per-row conv
    and SSM state. Under tensor parallelism ``num_heads``, ``n_groups``, ``d_inner`` and
    ``conv_dim`` are this rank's sizes (``total_num_heads`` / ``total_n_groups`` the
    model's); n_groups and tensor_parallel_size must divide one another."""

    def __init__(
        self, hidden_size: int, *, num_heads: int, head_dim: int, d_state: int, n_groups: int = 1,
        d_conv: int = 4, expand_size: int | None = None, chunk_size: int = 256, conv_bias: bool = True,
        proj_bias: bool = False, norm_eps: float = 1e-6, activation: str = "silu",
        dt_limit: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        d_inner = expand_size if expand_size is not None else num_heads * head_dim
        if num_heads * head_dim != d_inner:
            raise ValueError(f"mamba num_heads={num_heads} x head_dim={head_dim} != inner size {d_inner}")
        if num_heads % n_groups:
            raise ValueError(f"mamba num_heads={num_heads} is not a multiple of n_groups={n_groups}")
        if activation not in ("silu", "swish"):
            raise ValueError(f"mamba conv activation {activation!r} is not supported: expected 'silu'")
        if d_conv < 2:
            raise ValueError(f"mamba d_conv={d_conv} must be >= 2")
        tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        if n_groups % tp and tp % n_groups:
            raise ValueError(f"mamba n_groups={n_groups} and tensor_parallel_size={tp}: one must divide the other "
                             "(groups are split across ranks, or each rank keeps the one group its heads read)")
        heads = _rank_part(num_heads, tp, rank, "mamba num_heads")
        inner = _rank_part(d_inner, tp, rank, "mamba inner size")
        # 1/tp of the groups, or the single group every head of this rank reads
        local_groups = n_groups // tp if n_groups % tp == 0 else 1
        groups = (n_groups * d_state, rank * n_groups // tp * d_state, local_groups * d_state)
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, heads[2], head_dim
        self.d_state, self.n_groups, self.d_conv, self.d_inner = d_state, local_groups, d_conv, inner[2]
        self.total_num_heads, self.total_n_groups = num_heads, n_groups
        self.chunk_size, self.activation = chunk_size, activation
        self.dt_limit = tuple(dt_limit) if dt_limit is not None else (0.0, float("inf"))
        # the rank's sizes: its state rows hold only its own heads' channels
        self.conv_dim = self.d_inner + 2 * local_groups * d_state
        self.in_proj = _PackedColumnLinear(hidden_size, [inner, inner, groups, groups, heads], bias=proj_bias)
        self.conv1d = DepthwiseConv1d(self.conv_dim, d_conv, conv_bias, parts=[inner, groups, groups])
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_heads), requires_grad=False)
        self.D = nn.Parameter(torch.ones(self.num_heads), requires_grad=False)
        for name in ("dt_bias", "A_log", "D"):
            getattr(self, name).weight_loader = _parts_loader([heads], f"mamba {name}")
        self.norm = GatedRMSNorm(d_inner, d_inner // n_groups, norm_eps, split=True)
        self.out_proj = RowParallelLinear(d_inner, hidden_size, bias=proj_bias)
        self.kv_cache: tuple[torch.Tensor, ...] | None = None
        self.layer_name = ""
        # set by the ModelState before the state is declared: > 0 adds the verification
        # scratch (kernels/mamba_verify.py) to the row state
        self.num_speculative_tokens = 0

    def kv_cache_spec(self, layer_name: str, dtype: torch.dtype) -> RowStateSpec:
        """Per row: the last d_conv - 1 conv inputs (model dtype) and the SSM state (float32);
        with k = ``num_speculative_tokens`` > 0 also the verification scratch, a conv window
        [d_conv - 1 + k + 1, conv_dim] and k SSM states (kernels/mamba_verify.py)."""
        self.layer_name = layer_name
        ssm = (self.num_heads, self.head_dim, self.d_state)
        shapes, dtypes = ((self.d_conv - 1, self.conv_dim), ssm), (dtype, torch.float32)
        k = self.num_speculative_tokens
        if k:
            shapes += ((self.d_conv + k, self.conv_dim), (k, *ssm))
            dtypes += (dtype, torch.float32)
        return RowStateSpec(layer_name, shapes=shapes, dtypes=dtypes, scratch=2 if k else 0)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        if self.kv_cache is None:
            raise RuntimeError(f"mamba layer {self.layer_name or '?'} has no state bound")
        meta: dict[str, Any] | None = ctx.attn_metadata.extra.get("mamba")
        if meta is None:
            raise RuntimeError("mamba layer: attn_metadata.extra['mamba'] is missing (use MambaHybridModelState)")
        conv_state, ssm_state = self.kv_cache[:2]
        proj = self.in_proj(hidden)
        z, xbc, dt = proj.split([self.d_inner, self.conv_dim, self.num_heads], dim=-1)
        A = -torch.exp(self.A_log.float())
        weight = self.conv1d.weight.view(self.conv_dim, self.d_conv)
        verify = meta.get("verify")
        if verify is not None:
            if len(self.kv_cache) < 4:
                raise RuntimeError(f"mamba layer {self.layer_name}: a verification step needs the per-position "
                                   "scratch (num_speculative_tokens was 0 when its state was declared)")
            from core_runner.kernels.mamba_verify import stash_conv_window

            stash_conv_window(conv_state, self.kv_cache[2], xbc, verify["rows"], verify["starts"])
        if use_triton_kernels(hidden):
            y = self._scan_triton(ctx, meta, xbc, dt, A, weight, conv_state, ssm_state, verify)
        else:
            y = self._scan_ref(meta, xbc, dt, A, weight, conv_state, ssm_state, verify)
        y = self.norm(y.reshape(-1, self.d_inner), z)
        return self.out_proj(y)

    def rollback_verification(self, rows: torch.Tensor, accepted: torch.Tensor, counts: torch.Tensor) -> None:
        """After a verification step: the state of each of ``rows`` becomes the one its
        ``accepted`` (of ``counts``) proposals leave (device tensors; kernels/mamba_verify.py)."""
        from core_runner.kernels.mamba_verify import commit_verified

        if self.kv_cache is None or len(self.kv_cache) < 4:
            raise RuntimeError(f"mamba layer {self.layer_name}: a verification step without the per-position scratch")
        commit_verified(*self.kv_cache[:4], rows, accepted, counts)

    def _scan_triton(self, ctx, meta, xbc, dt, A, weight, conv_state, ssm_state, verify) -> torch.Tensor:
        from core_runner.kernels.mamba_ssd_triton import ssd_chunk_scan_varlen_triton
        from core_runner.kernels.mamba_triton import causal_conv1d_varlen_triton, ssm_scan_varlen_triton

        gn = self.n_groups * self.d_state
        rows, init, qsl = meta["state_rows"], meta["has_initial_state"], meta["query_start_loc"]
        conv_out = causal_conv1d_varlen_triton(xbc, weight, self.conv1d.bias, conv_state, rows, init, qsl,
                                               self.activation, write_state=meta["write_state"])
        x, B, C = conv_out.split([self.d_inner, gn, gn], dim=-1)
        kw = dict(num_heads=self.num_heads, head_dim=self.head_dim, n_groups=self.n_groups, d_state=self.d_state,
                  dt_limit=self.dt_limit, write_state=meta["write_state"])
        if verify is not None:
            # verification requests come last in the batch (runner order): the requests
            # before them take the usual scan, they the sequential one, saving each
            # position's state (kernels/mamba_verify.py)
            a, ta = verify["first"], verify["first_token"]
            y = torch.zeros(x.shape[0], self.num_heads, self.head_dim, dtype=torch.float32, device=x.device)
            if a:
                ssd_chunk_scan_varlen_triton(x[:ta], dt[:ta], A, B[:ta], C[:ta], self.D, self.dt_bias, ssm_state,
                                             rows[:a], init[:a], qsl[:a + 1], out=y[:ta], chunk_size=self.chunk_size,
                                             **kw)
            n = verify["num_reqs"]
            return ssm_scan_varlen_triton(x, dt, A, B, C, self.D, self.dt_bias, ssm_state, rows[a:n], init[a:n],
                                          qsl[a:n + 1], out=y, save_steps=self.kv_cache[3], **kw)
        # max_query_len is a host-side bound (1 for decode steps and decode graphs, the
        # padded token count for mixed graphs): prefill steps take the chunked scan
        # (which still gives single-token rows the one-step update), decode steps the
        # one-step update alone
        if ctx.attn_metadata.max_query_len > 1:
            scan = functools.partial(ssd_chunk_scan_varlen_triton, chunk_size=self.chunk_size)
        else:
            scan = ssm_scan_varlen_triton
        return scan(x, dt, A, B, C, self.D, self.dt_bias, ssm_state, rows, init, qsl, **kw)

    def _scan_ref(self, meta, xbc, dt, A, weight, conv_state, ssm_state, verify) -> torch.Tensor:
        from core_runner.kernels.mamba import mamba_varlen_ref

        rows = meta["state_rows_cpu"].tolist()
        init = meta["has_initial_state_cpu"].tolist()
        qsl = meta["query_start_loc_cpu"].tolist()
        sizes = dict(d_inner=self.d_inner, num_heads=self.num_heads, head_dim=self.head_dim, n_groups=self.n_groups,
                     d_state=self.d_state, activation=self.activation, dt_limit=self.dt_limit)
        a = verify["first"] if verify is not None else len(rows)
        y = mamba_varlen_ref(
            xbc, dt, weight, self.conv1d.bias, A, self.D, self.dt_bias, conv_state, ssm_state,
            rows[:a], init[:a], qsl[:a + 1], chunk_size=self.chunk_size, write_state=meta["write_state"], **sizes,
        )
        if verify is None:
            return y
        from core_runner.kernels.mamba_verify import mamba_verify_ref

        n = verify["num_reqs"]
        return y + mamba_verify_ref(
            xbc, dt, weight, self.conv1d.bias, A, self.D, self.dt_bias, conv_state, ssm_state, self.kv_cache[3],
            rows[a:n], qsl[a:n + 1], **sizes,
        )
