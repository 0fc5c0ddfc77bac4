"""The generic model runner.

This file may hold only what every model family shares. Anything that differs between
families belongs in a ModelState; be paranoid about adding lines here.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from core_runner.attention.backend import AttentionBackend, AttnMetadata
from core_runner.config import EngineConfig
from core_runner.distributed import get_tp_group, use_tp_group
from core_runner.forward_context import set_forward_context
from core_runner.kernels.input_prep import post_update_ref, prepare_inputs_ref
from core_runner.kv_cache_dtype import apply_kv_cache_dtype
from core_runner.kv_cache_groups import plan_kv_cache_layout
from core_runner.kv_cache_spec import KVCacheSpec, PagedCacheSpec, RowStateSpec
from core_runner.model_state import ModelState
from core_runner.runner.async_output import AsyncOutput
from core_runner.runner.cuda_graphs import DEFAULT_CAPTURE_SIZES, CudaGraphManager, GraphKey
from core_runner.runner.drafter import DraftRunner
from core_runner.runner.output import ModelRunnerOutput
from core_runner.runner.pooled_output import PooledCopy
from core_runner.runner.request_state import RequestState
from core_runner.runner.spec_decode import (
    ProposalExtra,
    SpecExtra,
    accept,
    propose_ngram,
    verification_view,
    write_proposals,
)
from core_runner.sample import SamplerOutput, SamplingState, sample
from core_runner.sample.logprobs import StepLogprobs
from core_runner.step_data.input_batch import InputBatch, InputBuffers
from core_runner.step_data.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self, config: EngineConfig, model: nn.Module, model_state: ModelState, backend: AttentionBackend,
        *, triton_kernels: bool = False, cuda_graphs: bool = False,
        capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES, drafter: nn.Module | None = None,
        state_snapshot_slots: int = 0,
    ) -> None:
        self.config = config
        self.model = model
        self.model_state = model_state
        self.backend = backend
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        self.triton = triton_kernels
        # the tensor-parallel group this runner's model was built for (one rank by default):
        # entered around every step, so the layers' collectives use it
        self.tp_group = get_tp_group()
        self.req_state = RequestState(
            config.max_num_seqs, config.max_model_len, config.max_blocks_per_req, self.device
        )
        self.sampling = SamplingState(self.req_state.num_rows, self.device, self.req_state.tables()["token_ids"])
        self.sampler_triton = triton_kernels
        self.sampling.grammar.use_triton = triton_kernels
        self.generates = "generate" in model_state.supported_tasks
        self.kv_caches: dict[str, Any] = {}
        # prefix caching of row state: snapshot slots beside every row-state layer's rows
        self.state_snapshot_slots = state_snapshot_slots
        self.graphs = None
        max_tokens = config.max_num_batched_tokens
        if cuda_graphs:
            self.graphs = CudaGraphManager(capture_sizes, config.max_num_seqs,
                                           min(max_tokens, config.max_num_seqs * config.max_model_len))
        self.inputs = InputBuffers(config.max_num_seqs, max_tokens, config.max_blocks_per_req, self.device)
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # called with (req_ids, logits) of every real step (core_runner.engine.debug)
        self.logits_hooks: list[Callable[[list[str], torch.Tensor], None]] = []
        self.num_dummy_runs = 0
        # speculative decoding: the proposer's settings, the rows it proposes for and the
        # draft model's runner (None for n-gram proposals)
        self.spec = config.speculative_config
        self.spec_rows: set[int] = set()
        self._logged_eager_verification = False
        # with speculation a request's host counts are upper bounds while a step is in flight
        # (async); a backend that reads host lengths (not graph-capable: the torch reference)
        # gets exact ones copied back from the device, free on the CPU
        self.exact_host_lengths = self.spec is not None and not backend.supports_cuda_graphs
        self.drafter = None
        self._step_states: tuple[Any, AttnMetadata] | None = None
        if drafter is not None:
            self.drafter = DraftRunner(drafter, self.spec.num_speculative_tokens, self.req_state, model_state, backend,
                                       "triton" if triton_kernels else "torch", self.block_size, config.max_model_len)
        # which paged layers share a block table (and memory): kv_cache_groups.py
        self.kv_layout = plan_kv_cache_layout(self.cache_specs())
        self.req_state.set_num_kv_groups(self.kv_layout.num_groups)
        self.inputs.add_kv_groups(self.kv_layout.num_groups)
        self._bind_kv_groups()

    def cache_specs(self) -> list[KVCacheSpec]:
        """Every cache to allocate: the ModelState's, then the draft model's (``drafter.``)."""
        specs = self.model_state.kv_cache_specs()
        specs = specs + self.drafter.cache_specs() if self.drafter is not None else specs
        # kv_cache_dtype (fp8): the layers and kernels read the dtype off the cache tensor
        return apply_kv_cache_dtype(specs, self.config.kv_cache_dtype)

    def _bind_kv_groups(self) -> None:
        """Tell each paged layer its KV cache group (it reads that group's block table)."""
        group_of = self.kv_layout.group_of()
        modules = [("", self.model)] + ([("drafter.", self.drafter.model)] if self.drafter is not None else [])
        for prefix, root in modules:
            for name, module in root.named_modules():
                if callable(getattr(module, "kv_cache_spec", None)):
                    module.kv_cache_group = group_of.get(prefix + name, 0)

    # ---- memory -------------------------------------------------------------------
    def initialize_kv_cache(self, num_blocks: int, num_rows: int | None = None) -> None:
        """Allocate and bind every cache: ``num_blocks`` blocks per paged layer and
        ``num_rows`` (None: every request row) rows of each layer's row state, with the
        prefix-cache snapshot slots when there are rows. Caches bound before are replaced."""
        rows = self.req_state.num_rows if num_rows is None else num_rows
        specs = self.cache_specs()
        self.kv_caches.update(self.kv_layout.allocate(specs, num_blocks, self.block_size, self.device))
        for spec in specs:
            if isinstance(spec, PagedCacheSpec):
                continue
            elif isinstance(spec, RowStateSpec):
                self.kv_caches[spec.layer_name] = spec.allocate(rows, self.device)
            else:
                raise TypeError(f"unknown cache spec {spec!r}")
        if self.drafter is not None:
            self.drafter.bind(self.kv_caches)
        self.model_state.bind_kv_caches({k: v for k, v in self.kv_caches.items() if not k.startswith("drafter.")})
        if self.state_snapshot_slots:
            slots = self.state_snapshot_slots if rows else 0
            self.model_state.bind_state_snapshots({
                s.layer_name: s.persistent().allocate(slots, self.device)
                for s in self.model_state.kv_cache_specs() if isinstance(s, RowStateSpec)})

    def release_kv_caches(self) -> None:
        """Free the bound caches: zero-size ones of the same structure are bound in their
        place (through the same binds, so the layers and the ModelState drop their
        references), and the runner keeps none."""
        self.initialize_kv_cache(0, num_rows=0)
        self.kv_caches.clear()

    # ---- one step -----------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput, dummy: bool = False) -> AsyncOutput:
        with use_tp_group(self.tp_group):
            handle = self._execute(out, dummy)
        if not dummy:  # structured outputs: this step's grammar tokens are fed before the next step samples
            self.sampling.grammar.track(handle)
            self.sampling.plugins.track(handle)
        return handle

    def _execute(self, out: SchedulerOutput, dummy: bool) -> AsyncOutput:
        if dummy:
            self.num_dummy_runs += 1
            n = max(1, out.total_num_scheduled_tokens)
            return self._run(self._dummy_batch(max(1, len(out.num_scheduled_tokens)), n))
        # 1. removals (finished and preempted alike) before additions
        self._remove(out.finished_req_ids | out.preempted_req_ids)
        # 2. additions
        for new in out.new_reqs:
            row = self.req_state.add(new)
            self.sampling.add_request(row, new)
            self.model_state.add_request(row, new)
            if new.speculative and self.spec is not None:
                self.spec_rows.add(row)
        # 3. block-table appends, then every staged write at once
        for req_id, block_ids in out.new_block_ids.items():
            self.req_state.append_blocks(self.req_state.req_id_to_row[req_id], block_ids)
        self.req_state.apply_staged_writes()
        self.sampling.apply_staged_writes()
        self.model_state.apply_staged_writes()
        if out.is_empty:
            return AsyncOutput.done(ModelRunnerOutput([], []))
        # 4. idx_mapping: decode rows first, then prefill chunks, then requests verifying
        # proposals (a ModelState may rely on that order: model_state.py)
        sched, verify = out.num_scheduled_tokens, out.spec_token_counts
        req_ids = sorted(sched, key=lambda r: (sched[r] > 1) + (verify.get(r, 0) > 0))
        rows = [self.req_state.req_id_to_row[r] for r in req_ids]
        q_lens = [sched[r] for r in req_ids]
        computed = [out.num_computed_tokens[r] for r in req_ids]
        batch = self._build_batch(req_ids, rows, q_lens, computed, eager=self._eager_verification(out))
        if out.spec_token_counts:
            batch.spec_counts = [out.spec_token_counts.get(r, 0) for r in req_ids]
        if self.spec is not None:
            batch.propose_reqs = [i for i, (r, row) in enumerate(zip(req_ids, rows))
                                  if row in self.spec_rows and r in out.sample_req_ids]
        return self._run(batch, out.state_snapshots)

    def _remove(self, req_ids: set[str] | list[str]) -> None:
        for req_id in req_ids:
            row = self.req_state.remove(req_id)
            if row is not None:
                self.sampling.remove_request(row)
                self.model_state.remove_request(row)
                self.spec_rows.discard(row)

    def reset_rows(self, req_ids: list[str]) -> None:
        """After a failed step: free these requests' rows now (ids without a row are
        skipped). Writes staged for the failed step are flushed first, so none of them
        lands on a row after it is reused; a table whose flush fails drops its writes
        (StagedWriteTensor clears them either way)."""
        for part in (self.req_state, self.sampling, self.model_state):
            try:
                part.apply_staged_writes()
            except Exception:
                logger.exception("discarding the staged writes of %s after a failed step", type(part).__name__)
        self._remove(req_ids)

    def _eager_verification(self, out: SchedulerOutput) -> bool:
        """A step verifying proposals runs eagerly when the ModelState says its layers need it."""
        if not any(out.spec_token_counts.values()) or self.model_state.verification_cuda_graphs or self.graphs is None:
            return False
        if not self._logged_eager_verification:
            logger.info("CUDA graphs off for verification steps: %s keeps per-position state only in eager steps",
                        type(self.model_state).__name__)
            self._logged_eager_verification = True
        return True

    def _dummy_batch(self, num_reqs: int, num_tokens: int, key: GraphKey | None = None) -> InputBatch:
        """Every request points at the scratch row (no cached tokens); no slot is written.
        Tokens are spread so that no request exceeds max_model_len; a step can never hold
        more than max_num_seqs x max_model_len tokens, so neither does a dummy one."""
        c = self.config
        num_tokens = min(num_tokens, c.max_num_seqs * c.max_model_len)
        num_reqs = max(min(num_reqs, num_tokens, c.max_num_seqs), -(-num_tokens // c.max_model_len))
        q_lens = [num_tokens // num_reqs] * num_reqs
        q_lens[-1] += num_tokens - sum(q_lens)
        rows = [self.req_state.scratch_row] * num_reqs
        return self._build_batch([f"dummy-{i}" for i in range(num_reqs)], rows, q_lens, [0] * num_reqs,
                                 key=key, dummy=True)

    def _build_batch(
        self, req_ids: list[str], rows: list[int], q_lens: list[int], computed: list[int],
        key: GraphKey | None = None, dummy: bool = False, eager: bool = False,
    ) -> InputBatch:
        # 5. input prep on the device from persistent state
        n, t = len(rows), sum(q_lens)
        if key is None and self.graphs is not None and not dummy and not eager:
            key = self.graphs.select(n, t, all(q == 1 for q in q_lens))
        r_pad, t_pad = (key.num_reqs, key.num_tokens) if key else (n, t)
        idx, qsl, idx_cpu, qsl_cpu = self.inputs.stage(rows, q_lens, r_pad, self.req_state.scratch_row)
        seq_cpu = torch.zeros(r_pad, dtype=torch.int32)
        seq_cpu[:n] = torch.tensor([c + q for c, q in zip(computed, q_lens)], dtype=torch.int32)
        tables = self.req_state.tables()
        args = (idx, qsl, tables["num_computed"], tables["token_ids"], tables["block_table"], self.block_size, t_pad)
        if self.triton:
            from core_runner.kernels.input_prep_triton import prepare_inputs_triton

            prep = prepare_inputs_triton(*args, out=self.inputs.out)
        else:
            prep = prepare_inputs_ref(*args)
        group_tables, group_slots = self._group_inputs(tables, idx, qsl, prep["positions"], prep["slot_mapping"])
        if dummy:
            prep["slot_mapping"].fill_(-1)
            for t in group_slots:
                t.fill_(-1)
        computed_cpu = torch.tensor(computed, dtype=torch.int32)
        if self.exact_host_lengths and not dummy:
            seq_cpu[:n] = prep["seq_lens"][:n].cpu()
            computed_cpu = seq_cpu[:n] - torch.tensor(q_lens, dtype=torch.int32)
        return InputBatch(
            req_ids=req_ids, num_reqs=n, num_tokens=t, idx_mapping=idx, idx_mapping_cpu=idx_cpu,
            query_start_loc=qsl, query_start_loc_cpu=qsl_cpu, seq_lens=prep["seq_lens"], seq_lens_cpu=seq_cpu,
            num_computed_cpu=computed_cpu,
            input_ids=prep["input_ids"], positions=prep["positions"], slot_mapping=prep["slot_mapping"],
            block_tables=prep["block_tables"], logits_indices=prep["logits_indices"],
            max_query_len=(1 if key.decode else t_pad) if key else max(q_lens),
            max_seq_len=self.config.max_model_len if key else int(seq_cpu.max()),
            is_dummy=dummy, num_reqs_padded=r_pad, num_tokens_padded=t_pad, graph_key=key,
            group_block_tables=group_tables, group_slot_mappings=group_slots,
        )

    def _group_inputs(self, tables: dict[str, torch.Tensor], idx: torch.Tensor, qsl: torch.Tensor,
                      positions: torch.Tensor, slots0: torch.Tensor) -> tuple[tuple, tuple]:
        """Block tables and slot mappings of KV cache groups 1.. (group 0's come from input
        prep), written into static buffers on the device: no host read, graph-safe."""
        n = self.kv_layout.num_groups
        if n <= 1:  # group 0's come from input prep; a model without paged layers has none
            return (), ()
        t = positions.shape[0]
        r = idx.shape[0]
        req = torch.searchsorted(qsl[1:r + 1], torch.arange(t, device=qsl.device, dtype=qsl.dtype), right=True)
        req = req.clamp_(max=max(r - 1, 0))
        pos = positions.long()
        # what every group shares is computed once: each op here is an eager launch per step
        # (Gemma 3 has 6 groups past the first, and its decode steps are host-bound)
        rows, col, off, pad = idx.long(), pos // self.block_size, pos % self.block_size, slots0 < 0
        out_tables, out_slots = [], []
        # a dummy run may exceed the static buffers (sized for real steps): it gets its own
        static = t <= self.inputs.out["slot_mapping"].shape[0] and r <= self.inputs.out["block_tables"].shape[0]
        for g in range(1, n):
            table = tables[f"block_table.{g}"]
            if static:
                bt = self.inputs.out[f"block_tables.{g}"][:r]
                torch.index_select(table, 0, rows, out=bt)
                sl = self.inputs.out[f"slot_mapping.{g}"][:t]
            else:
                bt = table.index_select(0, rows)
                sl = torch.empty(t, dtype=slots0.dtype, device=slots0.device)
            torch.add(off, bt[req, col], alpha=self.block_size, out=sl)  # block * block_size + offset
            sl.masked_fill_(pad, -1)
            out_tables.append(bt)
            out_slots.append(sl)
        return tuple(out_tables), tuple(out_slots)

    def _forward(self, batch: InputBatch) -> tuple[Any, AttnMetadata]:
        # 6. family-specific inputs and metadata; 7. forward (graph replay when one fits)
        if batch.is_dummy:
            extra = self.model_state.prepare_dummy_inputs(batch.num_reqs_padded, batch.num_tokens_padded)
        else:
            extra = self.model_state.prepare_inputs(batch)
        attn = self.model_state.prepare_attn(batch)
        key = batch.graph_key
        if key is not None and self.graphs is not None and self.graphs.has(key) and not batch.is_dummy:
            return self.graphs.replay(key), attn
        with set_forward_context(attn, self.backend, "triton" if self.triton else "torch"):
            return self.model(batch.input_ids, batch.positions, **extra), attn

    def _run(self, batch: InputBatch, state_snapshots: dict[str, int] | None = None) -> AsyncOutput:
        out, attn = self._forward(batch)
        if state_snapshots:  # the rows' state after this step, kept for prefix hits
            rows = self.req_state.req_id_to_row
            self.model_state.save_state_snapshots([rows[r] for r in state_snapshots], list(state_snapshots.values()))
        # a target serving an EAGLE-3 draft returns (hidden, the inputs of some layers)
        hidden = out[0] if isinstance(out, tuple) else out
        if self.spec is not None and not batch.is_dummy:  # what the proposer reads after sampling
            self._step_states = (out, attn)
        n = batch.num_reqs
        num_sched = (batch.query_start_loc[1:n + 1] - batch.query_start_loc[:n]).to(torch.int32)
        if not self.generates:
            pooled = [] if batch.is_dummy else self.model_state.pool(hidden, batch)
            if not batch.is_dummy:  # advance num_computed as post-update does: a next chunk reads it
                self.req_state.tables()["num_computed"].index_add_(0, batch.idx_mapping[:n].long(), num_sched)
            if not pooled:
                return AsyncOutput.done(ModelRunnerOutput(batch.req_ids, [], pooled))
            return AsyncOutput(batch.req_ids, None, None, self.copy_stream, PooledCopy(pooled))
        # 8. logits of the real rows, sampling, logprobs
        if batch.spec_counts is not None and not batch.is_dummy:
            return self._run_verification(batch, hidden, num_sched)
        logits = self.model.compute_logits(hidden[batch.logits_indices[:n]])
        if not batch.is_dummy:
            for hook in self.logits_hooks:
                hook(batch.req_ids, logits)
        out = self._sample(batch, logits)
        # every rank samples the same token from the same gathered logits; rank 0's copy is
        # sent to all so that no kernel's rounding can ever make the ranks' token ids differ
        sampled = self.tp_group.broadcast(out.sampled, src=0)
        if batch.is_dummy:
            return AsyncOutput.done(ModelRunnerOutput(batch.req_ids, []))
        prompt = self.sampling.prompt_logprobs.compute(batch, hidden, self.model.compute_logits, self.sampler_triton)
        # 9. post-update on the device, 10. family post-processing, async copy-out
        self._post_update(batch, num_sched, sampled)
        proposed = self._propose(batch, batch.logits_indices[:n])
        extra = StepLogprobs.collect(batch.req_ids, out.logprobs, out.logprob_rows, prompt)
        if proposed is not None:
            extra = ProposalExtra(*proposed, inner=extra)
        return AsyncOutput(batch.req_ids, self._flag_non_finite(logits, sampled), None, self.copy_stream, extra)

    def _post_update(self, batch: InputBatch, num_sched: torch.Tensor, sampled: torch.Tensor) -> None:
        tables = self.req_state.tables()
        idx = batch.idx_mapping[: batch.num_reqs]
        post_args = (idx, num_sched, sampled, tables["num_computed"], tables["num_tokens"], tables["token_ids"])
        if self.triton:
            from core_runner.kernels.input_prep_triton import post_update_triton

            post_update_triton(*post_args)
        else:
            post_update_ref(*post_args)
        self.model_state.postprocess_state(batch, sampled)

    @staticmethod
    def _flag_non_finite(logits: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
        """A row whose sampled token has a NaN / inf logit (fp16 overflow makes the whole row
        NaN) reaches the host as -1 - token, which the scheduler finishes with "error"; the
        device keeps the plain token. O(rows) and no sync: the flag rides the copy."""
        bad = ~torch.isfinite(logits.gather(1, sampled.view(-1, 1).long()).view(-1))
        return torch.where(bad, -1 - sampled, sampled)

    def _run_verification(self, batch: InputBatch, hidden: torch.Tensor, num_sched: torch.Tensor) -> AsyncOutput:
        """A step in which some requests verify proposals (see ``runner/spec_decode.py``)."""
        n = batch.num_reqs
        v = verification_view(batch, batch.spec_counts)
        logits = self.model.compute_logits(hidden[v.logits_indices])
        self.sampling.grammar.begin_verification(batch.spec_counts)
        out = self._sample(v.view, logits)
        sampled_all, cap = self._broadcast_verification(out.sampled, v)
        tables = self.req_state.tables()
        idx = batch.idx_mapping[:n]
        accepted, final, target = accept(sampled_all, v, idx.long(), tables["num_tokens"], tables["token_ids"], cap)
        final_logits = logits[v.first + accepted]
        for hook in self.logits_hooks:
            hook(batch.req_ids, final_logits)
        prompt = self.sampling.prompt_logprobs.compute(batch, hidden, self.model.compute_logits, self.sampler_triton)
        # the kept proposals are already in the token table: count them as known, then the
        # usual update appends the sampled token after them
        counts = v.counts_dev
        self.model_state.postprocess_verification(batch, accepted, counts)
        tables["num_tokens"].index_add_(0, idx.long(), accepted.to(tables["num_tokens"].dtype))
        self._post_update(batch, (num_sched - counts + accepted).to(num_sched.dtype), final)
        proposed = self._propose(batch, v.logits_indices[v.first + accepted])
        inner = StepLogprobs.collect(v.view.req_ids, out.logprobs, out.logprob_rows, prompt)
        if proposed is not None:
            inner = ProposalExtra(*proposed, inner=inner)
        extra = SpecExtra(batch.req_ids, batch.spec_counts, target, accepted, inner)
        return AsyncOutput(batch.req_ids, self._flag_non_finite(final_logits, final), None, self.copy_stream, extra)

    def _broadcast_verification(self, sampled: torch.Tensor, v) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rank 0's tokens of every logits row, how many proposals each request may keep
        where structured outputs bound it: the positions its grammar could mask). Only rank 0
        holds grammars, so with TP its bound rides the broadcast of the sampled tokens (one
        collective; the request's k when it has none) and every rank keeps the same proposals."""
        cap = self.sampling.grammar.caps
        self.sampling.grammar.caps = None
        if self.tp_group.world_size == 1:
            return sampled, cap
        bound = (cap if cap is not None else v.counts_dev).to(sampled.dtype)
        both = self.tp_group.broadcast(torch.cat([sampled, bound]), src=0)
        m = sampled.numel()
        return both[:m], both[m:].long()

    def _propose(self, batch: InputBatch, sample_idx: torch.Tensor) -> tuple | None:
        """Proposals for the speculating requests that sampled this step, written after their
        known tokens (``sample_idx[i]``: the token index of request i's last kept position):
        from the draft model (which also runs over the whole step to fill its KV cache), or
        n-gram lookups. Returns (request ids, whether each found a match (n-gram; None for a
        draft), the proposals when one of them has a grammar (else None)) or None."""
        if self.spec is None:
            return None
        target_out, attn = self._step_states
        self._step_states = None
        reqs = batch.propose_reqs or []
        rows = batch.idx_mapping_cpu[reqs].tolist()
        matched = None
        if self.drafter is not None:  # runs even without rows: its first pass fills the draft's KV
            proposals = self.drafter.propose(batch, target_out, attn, sample_idx, reqs)
        if not rows:
            return None
        if self.drafter is None:
            tables = self.req_state.tables()
            dev = torch.tensor(rows).to(self.device, non_blocking=True)  # torch.tensor(device=) would wait
            s = self.spec
            proposals, matched = propose_ngram(tables["token_ids"], dev, tables["num_tokens"],
                                               s.num_speculative_tokens, s.prompt_lookup_min, s.prompt_lookup_max)
            write_proposals(tables["token_ids"], dev, tables["num_tokens"], proposals)
        if self.sampling.grammar.users.isdisjoint(rows):  # no grammar among them: nothing more to copy out
            proposals = None
        if matched is None and proposals is None:
            return None
        return [batch.req_ids[i] for i in reqs], matched, proposals

    def _sample(self, batch: InputBatch, logits: torch.Tensor) -> SamplerOutput:
        return sample(logits, batch, self.sampling, self.sampler_triton)

    # ---- CUDA graphs: capture is its own path -----------------------------------------
    @torch.inference_mode()
    def capture_graphs(self) -> int:
        if self.graphs is None:
            return 0
        keys = sorted(self.graphs.keys(), key=lambda k: -k.num_tokens)
        with use_tp_group(self.tp_group):
            self._capture(keys)
            if self.drafter is not None:
                self.graphs.pool = self.drafter.capture(self.graphs.decode_sizes, self.graphs.pool)
        logger.info("captured %d CUDA graphs", len(keys))
        return len(keys)

    def _capture(self, keys: list[GraphKey]) -> None:
        for key in tqdm(keys, desc="capturing CUDA graphs", disable=not logger.isEnabledFor(logging.INFO)):
            batch = self._dummy_batch(key.num_reqs, key.num_tokens, key=key)
            extra = self.model_state.prepare_dummy_inputs(key.num_reqs, key.num_tokens)
            attn = self.model_state.prepare_attn(batch, for_capture=True)

            def run(batch=batch, extra=extra, attn=attn) -> torch.Tensor:
                with set_forward_context(attn, self.backend, "triton" if self.triton else "torch"):
                    return self.model(batch.input_ids, batch.positions, **extra)

            self.graphs.capture(key, run)
            if self.drafter is not None:  # the draft's first pass over the same step
                self.graphs.pool = self.drafter.capture_first(key, batch, self.graphs.graphs[key][1], attn,
                                                              self.graphs.pool)
