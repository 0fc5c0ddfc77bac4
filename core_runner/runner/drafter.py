"""Running a draft model after each target step (see ``core_runner/draft_model.py``).

The first pass goes over every token of the step with the target's positions, slots and
attention metadata, so the draft's KV cache is filled wherever the target's is (prompt
chunks included, which keeps a prefix-cached block's draft KV complete). The token a
position reads is the one after it in the token table, gathered on the device after the
step's post-update: the next prompt token, an accepted proposal or the token just
sampled. The draft's output at each sampling request's last accepted position gives
proposal 1; k - 1 decode passes over those requests give the rest, at positions
L .. L + k - 2 (L = the request's last known position), whose blocks the scheduler
allocated ahead (``num_lookahead_tokens``). A position at or past max_model_len writes no
KV (its proposal could never be verified). Nothing here reads a device value on the host.

With CUDA graphs the first pass replays a graph captured for each of the target's graph
keys (the same static batch and metadata, the target graph's output as input), and the
decode passes replay graphs captured per padded request count and pass (a draft may pick
its layer by pass): their inputs are copied into static buffers, padded requests hold no
query token and write no slot. A step the target runs eagerly runs its draft eagerly too.
"""
from __future__ import annotations

import bisect
import logging
from typing import Any

import torch
from torch import nn

from core_runner.attention.backend import AttentionBackend, AttnMetadata
from core_runner.forward_context import set_forward_context
from core_runner.kv_cache_spec import KVCacheSpec, collect_kv_cache_specs
from core_runner.model_state import ModelState
from core_runner.runner.cuda_graphs import capture_graph
from core_runner.runner.request_state import RequestState
from core_runner.runner.spec_decode import write_proposals
from core_runner.step_data.input_batch import InputBatch

PREFIX = "drafter."
logger = logging.getLogger(__name__)


class DraftRunner:
    def __init__(self, model: nn.Module, num_speculative_tokens: int, req_state: RequestState,
                 model_state: ModelState, backend: AttentionBackend, kernels: str, block_size: int,
                 max_model_len: int) -> None:
        self.model, self.k = model, num_speculative_tokens
        self.req_state, self.model_state, self.backend, self.kernels = req_state, model_state, backend, kernels
        self.block_size, self.max_model_len = block_size, max_model_len
        # a backend that cannot be captured reads the host copies of the lengths: give it the
        # exact ones (it runs the reference path, where a copy back is acceptable)
        self.exact_host_lengths = not backend.supports_cuda_graphs
        self.graphs: dict[tuple[int, int], tuple[Any, Any]] = {}  # (padded requests, pass) -> (graph, output)
        self.first_graphs: dict[Any, tuple[Any, Any]] = {}  # the target's GraphKey -> (graph, output)
        self.sizes: list[int] = []
        self.num_replays = 0
        self.static: dict[str, torch.Tensor] = {}

    def cache_specs(self) -> list[KVCacheSpec]:
        return collect_kv_cache_specs(self.model, self._param().dtype, PREFIX)

    def _param(self) -> torch.Tensor:
        """A floating-point parameter: the draft's dtype and device (a draft may also hold
        integer tables, such as EAGLE-3's vocabulary map)."""
        return next(p for p in self.model.parameters() if p.is_floating_point())

    def bind(self, caches: dict[str, Any]) -> None:
        for name, cache in caches.items():
            if name.startswith(PREFIX):
                self.model.get_submodule(name[len(PREFIX):]).kv_cache = cache

    def _run(self, attn: AttnMetadata, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor,
             step: int) -> tuple[torch.Tensor, torch.Tensor]:
        with set_forward_context(attn, self.backend, self.kernels):
            return self.model(input_ids, positions, hidden, step)

    def _tokens(self, hidden: torch.Tensor, step: int) -> torch.Tensor:
        return self.model.draft_token_ids(self.model.compute_logits(hidden, step))

    def _first_pass(self, batch: InputBatch, target_out: Any, attn: AttnMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft over every token of the step: at position p the token at p + 1 (from the
        token table, after the step's post-update) and the target's state at p: its hidden
        state, or the layer inputs an EAGLE-3 target returns beside it, concatenated."""
        target_states = torch.cat(target_out[1], dim=-1) if isinstance(target_out, tuple) else target_out
        token_ids = self.req_state.tables()["token_ids"]
        n, t = batch.num_reqs, target_states.shape[0]
        qsl = batch.query_start_loc[1: n + 1]
        req_of = torch.searchsorted(qsl, torch.arange(t, device=qsl.device, dtype=qsl.dtype), right=True)
        rows_of = batch.idx_mapping[:n].long()[req_of.clamp_max(n - 1)]
        positions = batch.positions[:t]
        ids = token_ids[rows_of, (positions.long() + 1).clamp_max(token_ids.shape[1] - 1)]
        return self._run(attn, ids, positions, self.model.combine_hidden_states(target_states), 0)

    def capture_first(self, key: Any, batch: InputBatch, target_out: Any, attn: AttnMetadata, pool: Any) -> Any:
        """Capture the first pass of a step that replays the target's graph ``key``: the same
        static batch and metadata, the target graph's output as its input."""
        def run():
            return self._first_pass(batch, target_out, attn)

        graph, out = capture_graph(run, pool)
        self.first_graphs[key] = (graph, out)
        return graph.pool()

    def propose(self, batch: InputBatch, target_out: Any, attn: AttnMetadata,
                sample_idx: torch.Tensor, reqs: list[int]) -> torch.Tensor | None:
        """Run the first pass over the whole step (replaying its graph when the target's step
        replayed one) and, for the requests at indices ``reqs`` (speculating and sampling this
        step; ``sample_idx[i]`` = the token index of request i's last accepted position), the
        decode passes; write their k proposals after their known tokens (and return them,
        [len(reqs), k])."""
        tables = self.req_state.tables()
        token_ids = tables["token_ids"]
        n, device = batch.num_reqs, token_ids.device
        captured = self.first_graphs.get(batch.graph_key) if batch.graph_key is not None else None
        if captured is not None:
            captured[0].replay()
            self.num_replays += 1
            logits_h, next_h = captured[1]
        else:
            logits_h, next_h = self._first_pass(batch, target_out, attn)
        if not reqs:
            return None
        sel = torch.tensor(reqs).to(device, non_blocking=True)
        at = sample_idx[sel]
        rows = batch.idx_mapping[:n].long()[sel]
        proposals = [self._tokens(logits_h[at], 0)]
        hidden = next_h[at]
        last = tables["num_tokens"][rows].long() - 1  # the last known position, after post-update
        for j in range(1, self.k):
            db = self._decode_batch(batch, rows, reqs, last + (j - 1), proposals[-1])
            size = self._graph_size(len(reqs))
            if size is None:
                logits_h, hidden = self._run(self.model_state.prepare_attn(db), db.input_ids, db.positions, hidden, j)
            else:
                logits_h, hidden = self._replay(db, hidden, size, j)
            proposals.append(self._tokens(logits_h, j))
        stacked = torch.stack(proposals, dim=1)
        write_proposals(token_ids, rows, tables["num_tokens"], stacked)
        return stacked

    def _decode_batch(self, batch: InputBatch, rows: torch.Tensor, reqs: list[int], pos: torch.Tensor,
                      input_ids: torch.Tensor) -> InputBatch:
        """One query token per request at ``pos``: slots from the block table, lengths
        pos + 1; host lengths are bounds (or exact for a backend that reads them)."""
        m, bs, cap = len(reqs), self.block_size, self.max_model_len
        device = rows.device
        tables = self.req_state.tables()
        block_tables = tables["block_table"][rows]
        inside = pos < cap
        pos = pos.clamp_max(cap - 1)
        block = block_tables.gather(1, (pos // bs)[:, None]).squeeze(1).long()
        slots = torch.where(inside, block * bs + pos % bs, -1)
        seq_lens = (pos + 1).to(torch.int32)
        qsl = torch.arange(m + 1, dtype=torch.int32)
        seq_cpu = seq_lens.cpu() if self.exact_host_lengths else torch.full((m,), cap, dtype=torch.int32)
        return InputBatch(
            req_ids=[batch.req_ids[i] for i in reqs], num_reqs=m, num_tokens=m, idx_mapping=rows.to(torch.int32),
            idx_mapping_cpu=batch.idx_mapping_cpu[reqs], query_start_loc=qsl.to(device, non_blocking=True),
            query_start_loc_cpu=qsl, seq_lens=seq_lens, seq_lens_cpu=seq_cpu, num_computed_cpu=seq_cpu - 1,
            input_ids=input_ids.to(torch.int32), positions=pos, slot_mapping=slots, block_tables=block_tables,
            logits_indices=torch.arange(m, device=device), max_query_len=1,
            max_seq_len=int(seq_cpu.max()) if self.exact_host_lengths else cap, num_reqs_padded=m,
            num_tokens_padded=m,
        )

    # ---- CUDA graphs of the decode passes ---------------------------------------------
    def capture(self, sizes: list[int], pool: Any) -> Any:
        """Capture the decode passes for these padded request counts (after the caches are
        bound); returns the memory pool, shared with the target's graphs."""
        if self.k < 2 or not sizes:
            return pool
        m, device, dtype = max(sizes), self._param().device, self._param().dtype
        width = self.req_state.tables()["block_table"].shape[1]
        i32, i64 = torch.int32, torch.int64
        self.static = {
            "input_ids": torch.zeros(m, dtype=i32, device=device),
            "positions": torch.zeros(m, dtype=i64, device=device),
            "hidden": torch.zeros(m, self.model.hidden_size, dtype=dtype, device=device),
            "slot_mapping": torch.full((m,), -1, dtype=i64, device=device),
            "seq_lens": torch.zeros(m, dtype=i32, device=device), "qsl": torch.zeros(m + 1, dtype=i32, device=device),
            "block_tables": torch.zeros(m, width, dtype=i32, device=device),
        }
        for size in sorted(sizes, reverse=True):
            db = self._static_batch(size)
            attn = self.model_state.prepare_attn(db, for_capture=True)
            for j in range(1, self.k):
                def run(db=db, attn=attn, j=j):
                    return self._run(attn, db.input_ids, db.positions, self.static["hidden"][: db.num_reqs], j)

                graph, out = capture_graph(run, pool)
                pool = graph.pool()
                self.graphs[(size, j)] = (graph, out)
        self.sizes = sorted(sizes)
        logger.info("captured %d CUDA graphs of the draft's decode passes", len(self.graphs))
        return pool

    def _graph_size(self, m: int) -> int | None:
        i = bisect.bisect_left(self.sizes, m)
        return self.sizes[i] if i < len(self.sizes) else None

    def _static_batch(self, size: int) -> InputBatch:
        s, cap = self.static, self.max_model_len
        return InputBatch(
            req_ids=[f"draft-pad-{i}" for i in range(size)], num_reqs=size, num_tokens=size,
            idx_mapping=torch.zeros(size, dtype=torch.int32, device=s["qsl"].device),
            idx_mapping_cpu=torch.zeros(size, dtype=torch.int32), query_start_loc=s["qsl"][: size + 1],
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32), seq_lens=s["seq_lens"][:size],
            seq_lens_cpu=torch.full((size,), cap, dtype=torch.int32),
            num_computed_cpu=torch.zeros(size, dtype=torch.int32), input_ids=s["input_ids"][:size],
            positions=s["positions"][:size], slot_mapping=s["slot_mapping"][:size],
            block_tables=s["block_tables"][:size], logits_indices=torch.arange(size, device=s["qsl"].device),
            max_query_len=1, max_seq_len=cap, num_reqs_padded=size, num_tokens_padded=size,
        )

    def _replay(self, db: InputBatch, hidden: torch.Tensor, size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the pass's inputs into the static buffers (padding: no query, no slot), replay."""
        s, m = self.static, db.num_reqs
        for name, src in (("input_ids", db.input_ids), ("positions", db.positions), ("hidden", hidden),
                          ("slot_mapping", db.slot_mapping), ("seq_lens", db.seq_lens),
                          ("block_tables", db.block_tables)):
            s[name][:m].copy_(src)
        s["slot_mapping"][m:size].fill_(-1)
        s["seq_lens"][m:size].zero_()
        s["qsl"][: m + 1].copy_(db.query_start_loc)
        s["qsl"][m + 1: size + 1].fill_(m)
        graph, (logits_h, next_h) = self.graphs[(size, step)]
        graph.replay()
        self.num_replays += 1
        return logits_h[:m], next_h[:m]
