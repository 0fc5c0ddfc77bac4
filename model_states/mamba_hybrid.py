"""MambaHybridModelState: per-request recurrent state beside the paged KV cache, if any.

Mamba layers keep, per request row, a conv window and an SSM state (``RowStateSpec``,
allocated ``[max_num_seqs + 1, ...]``; the last row is the scratch row of dummy runs and
CUDA-graph padding). Attention layers keep their usual paged K/V; an attention-free model
(Mamba2ForCausalLM) has none, and this state serves it as it is: it needs only a layer
with row state (unlike ``DefaultModelState``, which refuses a model without a paged one),
and its metadata carries empty block tables that no layer reads.

- ``add_request`` zeroes the row's state in every Mamba layer. The reset is staged and
  applied in ``apply_staged_writes`` with one small host-to-device copy of the row ids
  (pinned, double-buffered: no host sync) and one ``index_fill_`` per state tensor, so
  a reused row is exactly like a fresh one.
- Prefix caching (docs/hybrid_prefix_caching.md): a request admitted with a hit
  (``NewRequest.state_slot`` >= 0) gets its row's state copied from that snapshot slot
  instead of zeroed, staged the same way (``index_copy_``); ``save_state_snapshots``
  copies rows into slots after a step's forward, with its own pinned id buffer.
- ``remove_request`` (finish or preemption) needs nothing: the row is simply unused
  until the next ``add_request`` resets it. A preempted request comes back as a new
  request and re-prefills from its tokens.
- ``prepare_attn`` adds ``extra["mamba"]``: state rows (``idx_mapping``), whether each
  request continues from saved state (it has computed tokens), ``query_start_loc``, and
  ``write_state`` (False for dummy runs, which must not touch any row, the scratch row
  included). Device tensors sit at fixed addresses, refreshed in place each step, so
  captured CUDA graphs read the current step's values.
- Speculative decoding (docs/hybrid_speculation.md): with ``num_speculative_tokens`` k
  each Mamba layer's row state also holds a verification scratch; a verification step
  (requests verifying proposals come last in the batch) adds ``extra["mamba"]["verify"]``,
  the layers keep each position's state there, and ``postprocess_verification`` rolls
  every layer back to the accepted count on the device. Verification steps run eagerly
  (``verification_cuda_graphs = False``).
"""
from __future__ import annotations

import torch

from core_runner.sdk import AttnMetadata, InputBatch, KVCacheSpec, ModelState, NewRequest, RowStateSpec, UvaBackedTensor
from model_states.default import attn_metadata_from_batch, collect_kv_cache_specs

_ROW_TENSORS = ("conv_state", "ssm_state", "conv_window", "ssm_steps")


class MambaHybridModelState(ModelState):
    # the layers keep per-position states only in the eager verification path
    verification_cuda_graphs = False

    def __init__(self, config, model, device) -> None:
        super().__init__(config, model, device)
        self._reset_rows: list[int] = []
        self._reset_host = UvaBackedTensor((config.max_num_seqs + 1,), torch.int64, device)
        # has-initial-state flag per batch entry, at a fixed device address (graph safe)
        self._has_init = torch.zeros(config.max_num_seqs + 1, dtype=torch.bool, device=device)
        self._row_states: dict[str, tuple[torch.Tensor, ...]] = {}
        self._snapshots: dict[str, tuple[torch.Tensor, ...]] = {}
        # (row, slot) pairs: restores staged by add_request, saves of the current step
        self._restores: dict[int, int] = {}
        self._restore_host = UvaBackedTensor((2, config.max_num_seqs + 1), torch.int64, device)
        self._save_host = UvaBackedTensor((2, config.max_num_seqs + 1), torch.int64, device)

    # ---- caches -------------------------------------------------------------------
    def kv_cache_specs(self) -> list[KVCacheSpec]:
        dtype = next(self.model.parameters()).dtype
        self._declare_verification_scratch()
        specs = collect_kv_cache_specs(self.model, dtype)
        if not any(isinstance(s, RowStateSpec) for s in specs):
            raise ValueError(f"{type(self.model).__name__} has no layer with recurrent row state")
        return specs

    def bind_kv_caches(self, caches: dict) -> None:
        super().bind_kv_caches(caches)
        self._row_states = {name: tuple(c) for name, c in caches.items() if isinstance(c, (tuple, list))}

    def bind_state_snapshots(self, snapshots: dict[str, tuple[torch.Tensor, ...]]) -> None:
        unknown = sorted(set(snapshots) - set(self._row_states))
        if unknown:
            raise ValueError(f"state snapshots for layers without row state: {unknown}")
        self._snapshots = {name: tuple(t) for name, t in snapshots.items()}

    def save_state_snapshots(self, rows: list[int], slots: list[int]) -> None:
        n = len(rows)
        self._save_host.cpu[0, :n] = torch.tensor(rows, dtype=torch.int64)
        self._save_host.cpu[1, :n] = torch.tensor(slots, dtype=torch.int64)
        ids = self._save_host.snapshot()
        for name, snaps in self._snapshots.items():
            for row_t, snap_t in zip(self._row_states[name], snaps):
                snap_t.index_copy_(0, ids[1, :n], row_t.index_select(0, ids[0, :n]))

    def row_buffers(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensors in self._row_states.items():
            for kind, t in zip(_ROW_TENSORS, tensors):
                out[f"{name}.{kind}"] = t
        return out

    # ---- request lifecycle --------------------------------------------------------
    def add_request(self, row: int, request: NewRequest) -> None:
        slot = getattr(request, "state_slot", -1)
        if slot >= 0:
            if not self._snapshots:
                raise RuntimeError(f"request {request.req_id!r} resumes from state snapshot {request.state_slot} "
                                   "but no snapshot slots are bound")
            self._restores[row] = slot
            if row in self._reset_rows:
                self._reset_rows.remove(row)
            return
        self._restores.pop(row, None)
        if row not in self._reset_rows:
            self._reset_rows.append(row)

    def remove_request(self, row: int) -> None:
        return None

    def apply_staged_writes(self) -> None:
        if self._restores:
            n = len(self._restores)
            self._restore_host.cpu[0, :n] = torch.tensor(list(self._restores), dtype=torch.int64)
            self._restore_host.cpu[1, :n] = torch.tensor(list(self._restores.values()), dtype=torch.int64)
            self._restores = {}
            ids = self._restore_host.snapshot()
            for name, snaps in self._snapshots.items():
                for row_t, snap_t in zip(self._row_states[name], snaps):
                    row_t.index_copy_(0, ids[0, :n], snap_t.index_select(0, ids[1, :n]))
        if not self._reset_rows:
            return
        n = len(self._reset_rows)
        self._reset_host.cpu[:n] = torch.tensor(self._reset_rows, dtype=torch.int64)
        self._reset_rows = []
        rows = self._reset_host.snapshot(n)
        for tensors in self._row_states.values():
            for t in tensors:
                t.index_fill_(0, rows, 0)

    # ---- step inputs --------------------------------------------------------------
    def prepare_inputs(self, batch: InputBatch) -> dict[str, torch.Tensor]:
        return {}

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
        return {}

    def prepare_attn(self, batch: InputBatch, *, for_capture: bool = False) -> AttnMetadata:
        md = attn_metadata_from_batch(batch, causal=True)
        r = batch.idx_mapping.shape[0]
        qsl = batch.query_start_loc
        q_len = qsl[1: r + 1] - qsl[:r]
        has_init = self._has_init[:r]
        torch.gt(batch.seq_lens[:r] - q_len, 0, out=has_init)
        init_cpu = torch.zeros(r, dtype=torch.bool)
        init_cpu[: batch.num_reqs] = batch.num_computed_cpu[: batch.num_reqs] > 0
        md.extra["mamba"] = mamba = {
            "state_rows": batch.idx_mapping,
            "state_rows_cpu": batch.idx_mapping_cpu,
            "has_initial_state": has_init,
            "has_initial_state_cpu": init_cpu,
            "query_start_loc": qsl,
            "query_start_loc_cpu": batch.query_start_loc_cpu,
            # a dummy run leaves every row alone; a capture records the real step's writes
            "write_state": for_capture or not batch.is_dummy,
        }
        if batch.spec_counts is not None and any(batch.spec_counts) and not batch.is_dummy:
            mamba["verify"] = self._verify_meta(batch)
        return md

    def postprocess_state(self, batch: InputBatch, sampled: torch.Tensor | None) -> None:
        return None

    # ---- speculative decoding (kernels/mamba_verify.py) -----------------------------
    def _declare_verification_scratch(self) -> None:
        """Tell every layer that has a verification scratch how many proposals a step may
        verify, before it declares its row state."""
        spec = self.config.speculative_config
        k = spec.num_speculative_tokens if spec is not None else 0
        for module in self.model.modules():
            if hasattr(module, "num_speculative_tokens"):
                module.num_speculative_tokens = k

    @staticmethod
    def _verify_meta(batch: InputBatch) -> dict:
        """Where the verification requests are: the runner puts them after every other
        request, so they are the batch entries [first, num_reqs)."""
        counts, n = batch.spec_counts, batch.num_reqs
        first = next(i for i, k in enumerate(counts) if k)
        if not all(counts[first:n]):
            raise RuntimeError(f"verification requests must come last in the batch; proposal counts {counts}")
        return {"first": first, "num_reqs": n, "first_token": int(batch.query_start_loc_cpu[first]),
                "rows": batch.idx_mapping[first:n], "starts": batch.query_start_loc[first:n]}

    def postprocess_verification(self, batch: InputBatch, accepted: torch.Tensor, counts: torch.Tensor) -> None:
        """Every Mamba layer's state becomes the one its verification requests' accepted
        positions leave (``accepted`` / ``counts``: device [num_reqs], proposals kept and
        verified per request); no host read."""
        meta = self._verify_meta(batch)
        a, n = meta["first"], meta["num_reqs"]
        for name in self._row_states:
            self.model.get_submodule(name).rollback_verification(meta["rows"], accepted[a:n], counts[a:n])
