"""The generic model runner.

This file may hold only what every model family shares. Anything that differs between
families belongs in a ModelState; be paranoid about adding lines here.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from core_runner.attention.backend import AttentionBackend
from core_runner.config import EngineConfig
from core_runner.engine.scheduler_output import SchedulerOutput
from core_runner.forward_context import set_forward_context
from core_runner.kernels.input_prep import post_update_ref, prepare_inputs_ref
from core_runner.kv_cache_spec import PagedCacheSpec, RowStateSpec
from core_runner.runner.input_batch import InputBatch
from core_runner.runner.output import EMPTY_OUTPUT, ModelRunnerOutput
from core_runner.runner.request_state import RequestState
from core_runner.sample.sampler import Sampler
from core_runner.sample.sampling_state import SamplingState

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self, config: EngineConfig, model: nn.Module, model_state: Any, backend: AttentionBackend
    ) -> None:
        self.config = config
        self.model = model
        self.model_state = model_state
        self.backend = backend
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        self.req_state = RequestState(
            config.max_num_seqs, config.max_model_len, config.max_blocks_per_req, self.device
        )
        self.sampling = SamplingState(self.req_state.num_rows, self.device)
        self.sampler = Sampler()
        self.generates = "generate" in model_state.supported_tasks
        self.kv_caches: dict[str, Any] = {}
        # set to a list to record (req_ids, logits) of every real step (tests, conformance)
        self.recorded_logits: list[tuple[list[str], torch.Tensor]] | None = None

    # ---- memory -------------------------------------------------------------------
    def initialize_kv_cache(self, num_blocks: int) -> None:
        for spec in self.model_state.kv_cache_specs():
            if isinstance(spec, PagedCacheSpec):
                self.kv_caches[spec.layer_name] = spec.allocate(num_blocks, self.block_size, self.device)
            elif isinstance(spec, RowStateSpec):
                self.kv_caches[spec.layer_name] = spec.allocate(self.req_state.num_rows, self.device)
            else:
                raise TypeError(f"unknown cache spec {spec!r}")
        self.model_state.bind_kv_caches(self.kv_caches)

    # ---- one step -----------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput, dummy: bool = False) -> ModelRunnerOutput:
        if dummy:
            return self._run(self._dummy_batch(max(1, len(out.num_scheduled_tokens)),
                                               max(1, out.total_num_scheduled_tokens)))
        # 1. removals (finished and preempted alike) before additions
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            row = self.req_state.remove(req_id)
            if row is not None:
                self.model_state.remove_request(row)
        # 2. additions
        for new in out.new_reqs:
            row = self.req_state.add(new)
            self.sampling.add(row, new)
            self.model_state.add_request(row, new)
        # 3. block-table appends, then every staged write at once
        for req_id, block_ids in out.new_block_ids.items():
            self.req_state.append_blocks(self.req_state.req_id_to_row[req_id], block_ids)
        self.req_state.apply_staged_writes()
        self.sampling.apply_staged_writes()
        self.model_state.apply_staged_writes()
        if out.is_empty:
            return EMPTY_OUTPUT
        return self._run(self._prepare_batch(out))

    def _prepare_batch(self, out: SchedulerOutput) -> InputBatch:
        # 4. idx_mapping: decode rows first, then prefill chunks
        req_ids = sorted(out.num_scheduled_tokens, key=lambda r: out.num_scheduled_tokens[r] > 1)
        rows = [self.req_state.req_id_to_row[r] for r in req_ids]
        q_lens = [out.num_scheduled_tokens[r] for r in req_ids]
        computed = [out.num_computed_tokens[r] for r in req_ids]
        return self._build_batch(req_ids, rows, q_lens, computed, num_tokens=sum(q_lens))

    def _dummy_batch(self, num_reqs: int, num_tokens: int) -> InputBatch:
        """Every request points at the scratch row; no slot is written."""
        num_reqs = min(num_reqs, num_tokens, self.config.max_num_seqs)
        q_lens = [num_tokens // num_reqs] * num_reqs
        q_lens[-1] += num_tokens - sum(q_lens)
        batch = self._build_batch(
            [f"dummy-{i}" for i in range(num_reqs)], [self.req_state.scratch_row] * num_reqs,
            q_lens, [0] * num_reqs, num_tokens=num_tokens, dummy=True,
        )
        batch.slot_mapping.fill_(-1)
        return batch

    def _build_batch(
        self, req_ids: list[str], rows: list[int], q_lens: list[int], computed: list[int],
        num_tokens: int, dummy: bool = False,
    ) -> InputBatch:
        # 5. input prep from persistent state
        idx_cpu = torch.tensor(rows, dtype=torch.int32)
        qsl_cpu = torch.zeros(len(rows) + 1, dtype=torch.int32)
        qsl_cpu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
        seq_lens_cpu = torch.tensor([c + q for c, q in zip(computed, q_lens)], dtype=torch.int32)
        idx = idx_cpu.to(self.device, non_blocking=True)
        qsl = qsl_cpu.to(self.device, non_blocking=True)
        tables = self.req_state.tables()
        num_computed = tables["num_computed"]
        if dummy:
            num_computed = torch.zeros_like(num_computed)
        prep = prepare_inputs_ref(
            idx, qsl, num_computed, tables["token_ids"], tables["block_table"], self.block_size, num_tokens
        )
        return InputBatch(
            req_ids=req_ids, num_reqs=len(rows), num_tokens=num_tokens,
            idx_mapping=idx, idx_mapping_cpu=idx_cpu,
            query_start_loc=qsl, query_start_loc_cpu=qsl_cpu,
            seq_lens=prep["seq_lens"], seq_lens_cpu=seq_lens_cpu,
            num_computed_cpu=torch.tensor(computed, dtype=torch.int32),
            input_ids=prep["input_ids"], positions=prep["positions"],
            slot_mapping=prep["slot_mapping"], block_tables=prep["block_tables"],
            logits_indices=prep["logits_indices"],
            max_query_len=max(q_lens), max_seq_len=int(seq_lens_cpu.max()), is_dummy=dummy,
        )

    def _run(self, batch: InputBatch) -> ModelRunnerOutput:
        # 6. family-specific inputs and metadata
        if batch.is_dummy:
            extra = self.model_state.prepare_dummy_inputs(batch.num_reqs, batch.num_tokens)
        else:
            extra = self.model_state.prepare_inputs(batch)
        attn = self.model_state.prepare_attn(batch)
        # 7. forward
        with set_forward_context(attn, self.backend):
            hidden = self.model(batch.input_ids, batch.positions, **extra)
        if not self.generates:
            pooled = self.model_state.pool(hidden, batch)
            return ModelRunnerOutput(batch.req_ids, [], [] if batch.is_dummy else pooled)
        # 8. logits and sampling
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        s = self.sampling
        rows = batch.idx_mapping_cpu.tolist()
        any_random = any(s.temperature_cpu[r] > 0 for r in rows)
        any_cut = any_random and any(s.top_k_cpu[r] > 0 or s.top_p_cpu[r] < 1.0 for r in rows)
        idx = batch.idx_mapping.long()
        st = s.tables()
        out = self.sampler(
            logits, st["temperature"][idx], st["top_k"][idx], st["top_p"][idx], st["seed"][idx],
            batch.seq_lens, any_random=any_random, any_top_k_top_p=any_cut,
        )
        if batch.is_dummy:
            return ModelRunnerOutput(batch.req_ids, [])
        if self.recorded_logits is not None:
            self.recorded_logits.append((batch.req_ids, logits.float().cpu()))
        # 9. post-update on the device, 10. family post-processing
        tables = self.req_state.tables()
        num_sched = (batch.query_start_loc[1:] - batch.query_start_loc[:-1])
        post_update_ref(batch.idx_mapping, num_sched, out.sampled, tables["num_computed"],
                        tables["num_tokens"], tables["token_ids"])
        self.model_state.postprocess_state(batch, out.sampled)
        return ModelRunnerOutput(batch.req_ids, out.sampled.tolist())
