"""The sampling pipeline: one entry point, ``sample(logits, batch, state, use_triton)``.

Stages, in order (each a ``Stage`` object in ``SamplingState`` that owns its per-row state):

  0. structured outputs' token bitmask   (-inf outside the grammar, ``bitmask.py``)
  1. logit bias and min_tokens masking    (sparse edit, ``logit_bias.py``)
  2. repetition / frequency / presence    (sparse edit, ``penalties.py``)
  2b. logits-processor plugins            (``processors.py``; none installed: skipped)
  3. temperature and seed                 (x = logit * 1/T, ``gumbel.py``)
  4. min-p, top-k, top-p                  (one threshold per row, ``top_k_top_p.py``)
  5. Gumbel-Max                           (argmax(x + noise) over x >= threshold)
  then raw logprobs of the sampled tokens (``logprobs.py``); prompt logprobs are computed
  by the runner through ``state.prompt_logprobs`` (they need the hidden states).

Each stage gathers its inputs through the batch's idx_mapping and returns None when no
row of the batch uses it, decided from host mirrors, never by reading the device. The
input logits are never written: stages 1-2 edit a copy, made only when one of them runs,
so raw logprobs stay the model's. The torch path and the Triton path (``gumbel_triton``
for batches without a cut, ``top_k_top_p_triton`` otherwise) draw the same noise and apply
the same cuts, so they sample the same tokens (a token can differ only where a top-p
boundary or two noisy values tie to ~1e-6).

A new sampling parameter touches ``SamplingParams`` and one stage: a logits edit is a stage
in ``SamplingState.processors`` with ``prepare(step, vocab)`` and ``apply(logits, inputs)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from core_runner.sample.bitmask import GrammarStage
from core_runner.sample.gumbel import Draw, TemperatureStage, gumbel_sample_ref
from core_runner.sample.logit_bias import LogitBiasStage
from core_runner.sample.logprobs import LogprobsStage, LogprobTensors, gather_logprobs
from core_runner.sample.penalties import PenaltiesStage
from core_runner.sample.processors import ProcessorStage
from core_runner.sample.prompt_logprobs import PromptLogprobsStage
from core_runner.sample.stage import Step
from core_runner.sample.top_k_top_p import Cuts, CutStage, top_k_top_p_threshold_ref
from core_runner.step_data.input_batch import InputBatch
from core_runner.step_data.scheduler_output import NewRequest


@dataclass(slots=True)
class SamplerOutput:
    sampled: torch.Tensor  # [num_reqs] int64
    logprobs: LogprobTensors | None = None
    logprob_rows: list[tuple[int, int]] = field(default_factory=list)  # (batch position, k)


@dataclass(slots=True)
class StepInputs:
    """What the stages gathered for one step (None / empty: the stage does not run)."""

    draw: Draw | None  # None: every row is greedy
    cuts: Cuts | None = None
    edits: list[tuple[Callable[[torch.Tensor, Any], None], Any]] = field(default_factory=list)
    logprob_rows: list[tuple[int, int]] = field(default_factory=list)


class SamplingState:
    """Every sampling stage of the runner's persistent rows. ``token_ids``: the runner's
    [rows, max_model_len] token table (penalties and prompt logprobs read it)."""

    def __init__(self, num_rows: int, device: torch.device, token_ids: torch.Tensor | None = None) -> None:
        device = torch.device(device)
        self.temperature = TemperatureStage(num_rows, device)
        self.cuts = CutStage(num_rows, device)
        self.logit_bias = LogitBiasStage(num_rows, device)
        self.penalties = PenaltiesStage(num_rows, device, token_ids)
        self.logprobs = LogprobsStage(num_rows, device)
        self.prompt_logprobs = PromptLogprobsStage(num_rows, device, token_ids)
        self.grammar = GrammarStage(num_rows, device)
        self.plugins = ProcessorStage(num_rows, device)  # plugins: core_runner.sdk.LogitsProcessor
        self.processors = (self.grammar, self.logit_bias, self.penalties, self.plugins)  # logits edits, in order
        self.stages = (self.temperature, self.cuts, *self.processors, self.logprobs, self.prompt_logprobs)

    def add_request(self, row: int, req: NewRequest) -> None:
        if req.sampling_params is None:  # a pooling request: never sampled, so no stage reads its row
            return
        for s in self.stages:
            s.add_request(row, req)

    def remove_request(self, row: int) -> None:
        for s in self.stages:
            s.remove_request(row)

    def apply_staged_writes(self) -> None:
        for s in self.stages:
            s.apply_staged_writes()

    def host_state(self) -> dict[str, Any]:
        """Every stage's host mirrors, by stage class (a copy; for state checks)."""
        return {type(s).__name__: s.host_state() for s in self.stages}

    def tables(self) -> dict[str, torch.Tensor]:
        """Every per-row device table (dim 0 = row), by name."""
        return {k: t for s in self.stages for k, t in s.tables().items()}

    def prepare(self, batch: InputBatch, vocab: int) -> StepInputs:
        step = Step(batch)
        inputs = StepInputs(self.temperature.prepare(step), logprob_rows=self.logprobs.prepare(step))
        if inputs.draw is not None:
            inputs.cuts = self.cuts.prepare(step)
        for p in self.processors:
            x = p.prepare(step, vocab)
            if x is not None:
                inputs.edits.append((p.apply, x))
        return inputs


def draw_tokens(x: torch.Tensor, draw: Draw | None, cuts: Cuts | None, use_triton: bool) -> torch.Tensor:
    """Stages 3-5 on logits ``x`` (float32 on the torch path): argmax, a Gumbel draw, or one under the cuts."""
    if draw is None:
        return x.argmax(dim=-1)
    args = (x, draw.inv_temp, draw.seeds, draw.positions)
    if use_triton:
        if cuts is None:
            from core_runner.sample.gumbel_triton import gumbel_sample_triton

            return gumbel_sample_triton(*args)
        from core_runner.sample.top_k_top_p_triton import cut_sample_triton

        return cut_sample_triton(*args, cuts.top_k, cuts.top_p, cuts.log_min_p)
    thr = None if cuts is None else top_k_top_p_threshold_ref(x, draw.inv_temp, cuts.top_k, cuts.top_p, cuts.log_min_p)
    return gumbel_sample_ref(*args, thr)


def sample_inputs(logits: torch.Tensor, inputs: StepInputs, use_triton: bool = False) -> SamplerOutput:
    """The pipeline on gathered inputs (``sample`` without the state; tests call it too).

    The Triton kernels read the logits in their own dtype (bf16 logits are never widened
    into a [n, V] float32 copy); the torch path computes in float32."""
    raw = logits if use_triton else logits.float()
    work = raw
    if inputs.edits:
        work = logits.float()
        if work is logits:  # raw stays the model's: the edits go to a copy
            work = work.clone()
        for apply, x in inputs.edits:
            apply(work, x)
    sampled = draw_tokens(work, inputs.draw, inputs.cuts, use_triton)
    out = SamplerOutput(sampled, logprob_rows=inputs.logprob_rows)
    if inputs.logprob_rows:
        out.logprobs = gather_logprobs(raw, sampled, inputs.logprob_rows, use_triton)
    return out


def sample(logits: torch.Tensor, batch: InputBatch, state: SamplingState, use_triton: bool = False) -> SamplerOutput:
    """Sample one token per request of ``batch`` from its [num_reqs, V] logits."""
    return sample_inputs(logits, state.prepare(batch, logits.shape[-1]), use_triton)
