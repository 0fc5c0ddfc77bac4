"""The attention backend interface and the metadata every backend reads."""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from core_runner.attention.options import AttentionOptions


@dataclass(slots=True)
class AttnMetadata:
    """Per-step attention inputs, one entry per scheduled request (decode rows first).

    ``seq_lens[i]`` counts every token of request i that is in the cache after this
    step's write, so query token j of request i sits at absolute position
    ``seq_lens[i] - q_len[i] + j``. ``slot_mapping`` is -1 for padded tokens (no write).
    ``extra`` carries what a ModelState adds for its own layers (state rows, ...).
    """

    num_reqs: int
    num_tokens: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    max_query_len: int
    max_seq_len: int
    causal: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    # (block_tables, slot_mapping) of KV cache groups 1.. (core_runner/kv_cache_groups.py);
    # the fields above are group 0's
    kv_groups: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()

    def for_group(self, group: int) -> AttnMetadata:
        """This metadata with KV cache group ``group``'s block tables and slot mapping."""
        if group == 0:
            return self
        views = self.extra.setdefault("_kv_group_views", {})
        md = views.get(group)
        if md is None:
            if group > len(self.kv_groups):
                raise RuntimeError(
                    f"a layer of KV cache group {group} ran with metadata of {len(self.kv_groups) + 1} group(s): "
                    "the ModelState's prepare_attn must pass the batch's group tables (attn_metadata_from_batch "
                    "does)")
            bt, sm = self.kv_groups[group - 1]
            md = dataclasses.replace(self, block_tables=bt, slot_mapping=sm, extra=self.extra)
            views[group] = md
        return md


class AttentionBackend(ABC):
    """Writes new K/V into the paged cache and attends over it.

    A backend declares what it can do as class attributes; the oracle and the engine
    read them (a backend is registered by name in ``core_runner.attention.registry``):

    - ``supports_mla``: it implements ``forward_mla`` (MLA layers need it; the engine
      refuses a model with MLA layers and a backend without it, at construction),
    - ``supports_cuda_graphs``: its ``write_kv`` / ``forward`` read only device tensors and
      host-side bounds, so a step can be captured (graphs also need kernels='triton'),
    - ``needs_triton``: it launches Triton kernels (on the CPU only under TRITON_INTERPRET=1),
    - ``capability``: a model capability (``Registration.capability``) that a family must
      declare supported for this backend, or None,
    - ``supports_kv_scales``: its cache writes and reads take ``kv_scale`` (below); an fp8
      ``kv_cache_dtype`` needs it (refused at construction otherwise),
    - ``attention_features``: the layer options it implements (names from
      ``core_runner.attention.options.ATTENTION_FEATURES``); a layer using another one is
      refused at construction, naming the layer, the option and the backend.

    fp8 KV caches (docs/fp8_kv_cache.md): with an fp8 cache the layers pass ``kv_scale``
    (float32 [2] on the device: k then v; MLA uses [0] for the latent) to ``write_kv`` /
    ``forward`` / ``write_mla`` / ``forward_mla``; an entry is ``value / scale`` saturated to
    the format's range and reads as ``entry * scale``. It is never passed for other caches.
    """

    name: str = "abstract"
    supports_mla: bool = False
    supports_cuda_graphs: bool = False
    needs_triton: bool = False
    capability: str | None = None
    supports_kv_scales: bool = False
    attention_features: frozenset[str] = frozenset()

    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, md: AttnMetadata,
                 kv_scale: torch.Tensor | None = None) -> None:
        """Store ``k``/``v`` ([num_tokens, kv_heads, head_size]) at ``md.slot_mapping``
        (divided by ``kv_scale``'s k / v entry when given)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: AttnMetadata, scale: float,
        options: AttentionOptions | None = None, sinks: torch.Tensor | None = None,
        kv_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``q`` ([num_tokens, heads, head_size]) over the cached context.
        ``options`` (only passed when a layer sets one) and ``sinks`` ([heads], when
        ``options.sinks``) are the layer's options; see ``layers.attention.Attention``."""

    # ---- MLA: one latent vector per token (see core_runner.attention.mla) ----------
    def write_mla(self, latent_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                  md: AttnMetadata, kv_scale: torch.Tensor | None = None) -> None:
        """Store each token's latent ``kv_c`` [T, L] and roped key ``k_pe`` [T, R] in
        ``latent_cache`` [1, num_blocks, block_size, 1, L + R] at ``md.slot_mapping``
        (through ``write_kv``, which must take a one-part, one-head cache)."""
        from core_runner.attention.mla import write_latent

        write_latent(self, latent_cache, kv_c, k_pe, md, kv_scale)

    def forward_mla(self, q_c: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                    md: AttnMetadata, scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        """MLA with kv_b_proj absorbed: ``q_c`` [T, H, L] (W_UK^T q_nope), ``q_pe`` [T, H, R];
        returns softmax(q_c.c + q_pe.k_pe) @ c as [T, H, L]. A backend that implements it
        declares ``supports_mla = True``; the engine never routes MLA to one that does not."""
        raise NotImplementedError(f"attention backend {self.name!r} declares supports_mla=False")
