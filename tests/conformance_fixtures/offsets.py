"""A family whose ModelState owns per-row state that the model reads: each row's count
of computed tokens, from which the model takes the positions of its queries (keys keep
the runner's positions). It stands for any per-row state a family keeps (recurrent
state, accepted-token counts): right only if ``add_request`` resets the row, dummy runs
leave it alone, and it advances once per real step. A stale count shifts the queries
against the keys, which changes the logits."""
from __future__ import annotations

import dataclasses
import types

import torch
from core_runner_llama_template.model import LlamaForCausalLM

from model_states.default import DefaultModelState


def _attention_forward(self, positions, x):
    q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
    q = q.reshape(-1, self.num_heads, self.head_dim)
    k = k.reshape(-1, self.num_kv_heads, self.head_dim)
    qpos = positions if self.query_positions is None else self.query_positions
    q, _ = self.rotary_emb(qpos, q, k)
    _, k = self.rotary_emb(positions, q, k)
    return self.o_proj(self.attn(q, k, v))


class QueryPositionsFromState(LlamaForCausalLM):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.attns = [layer.self_attn for layer in self.model.layers]
        for attn in self.attns:
            attn.query_positions = None
            attn.forward = types.MethodType(_attention_forward, attn)

    def forward(self, input_ids, positions, query_positions=None):
        for attn in self.attns:
            attn.query_positions = query_positions
        return super().forward(input_ids, positions)


class Float32Only(LlamaForCausalLM):
    """Ignores EngineConfig.dtype: builds (and so loads) everything in float32."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.float()


class RowOffsetState(DefaultModelState):
    """Correct: resets its row on add, advances after each real step, untouched by dummies."""

    def __init__(self, config, model, device) -> None:
        super().__init__(config, model, device)
        self.offset = torch.zeros(config.max_num_seqs + 1, dtype=torch.int64, device=device)

    def row_buffers(self):
        return {"offset": self.offset}

    def add_request(self, row, request) -> None:
        self.offset[row] = 0

    def prepare_inputs(self, batch):
        n = batch.num_reqs
        qsl = batch.query_start_loc_cpu[: n + 1].tolist()
        pos = torch.zeros(batch.input_ids.shape[0], dtype=torch.int64)
        for i, row in enumerate(batch.idx_mapping_cpu[:n].tolist()):
            pos[qsl[i]:qsl[i + 1]] = int(self.offset[row]) + torch.arange(qsl[i + 1] - qsl[i])
        return {"query_positions": pos.to(self.device)}

    def postprocess_state(self, batch, sampled) -> None:
        n = batch.num_reqs
        rows = batch.idx_mapping_cpu[:n].long()
        q = batch.query_start_loc_cpu[1: n + 1] - batch.query_start_loc_cpu[:n]
        self.offset[rows.to(self.device)] += q.to(device=self.device, dtype=torch.int64)


class StaleRowState(RowOffsetState):
    """Bug: add_request forgets to reset the row, so a reused row starts where the previous
    request (or garbage) left off."""

    def add_request(self, row, request) -> None:
        return None


class DummyWritesState(RowOffsetState):
    """Bug: a dummy run "resets scratch state" by zeroing every row's offset."""

    def prepare_dummy_inputs(self, num_reqs, num_tokens):
        self.offset.zero_()
        return {}


class LossyParamsState(DefaultModelState):
    """Bug: takes a per-request setting out of the request on add (the logprob count, or
    the temperature on a core without logprobs). The runner read it first, so the first
    run is right, but a re-add after preemption runs with the count lost."""

    def add_request(self, row, request) -> None:
        sp = request.sampling_params
        if sp is None:
            return
        if "logprobs" in {f.name for f in dataclasses.fields(sp)}:
            if sp.logprobs is not None:
                object.__setattr__(sp, "logprobs", 0)
        else:
            object.__setattr__(sp, "temperature", 0.0)
