"""Per-row sampling settings, kept in the runner's persistent rows.

Every setting is written on every add (a reused row never keeps a previous request's
values) and gathered through idx_mapping each step. Numbers the kernels read live in
device tables (StagedWriteTensor); their host mirrors, plus the settings only the host
needs (logit-bias lists, min_tokens, logprob counts, how far prompt logprobs have
got), decide which pipeline stages run without reading the device. ``users`` keeps, per
stage, the rows whose request uses it, so a stage nobody uses costs one set test.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core_runner.step_data.scheduler_output import NewRequest
from core_runner.step_data.buffers import StagedWriteTensor
from core_runner.step_data.input_batch import InputBatch
from core_runner.sample.logit_bias import Edits, pack_edits, row_edits
from core_runner.sample.metadata import PenaltyInputs, SamplingMetadata, host_to_device

# temperatures below this are greedy (1 / T would overflow the logits' range)
GREEDY_EPS = 1e-5
# "cut_k_min_p": rows that cut with top-k or min-p (the others that cut use top-p alone)
STAGES = ("random", "cut", "cut_k_min_p", "edits", "repetition", "freq_pres", "logprobs", "prompt_logprobs")


@dataclass(slots=True)
class RowSampling:
    """Host mirror of one row (defaults: greedy, nothing else)."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    num_prompt_tokens: int = 0
    min_tokens: int = 0
    edits: Edits | None = None  # logit bias
    edits_min_tokens: Edits | None = None  # bias plus -inf on EOS / stop ids
    num_logprobs: int = -1
    num_prompt_logprobs: int = -1
    prompt_logprobs_next: int = 0  # first prompt position whose logprob is not yet computed


class SamplingState:
    def __init__(self, num_rows: int, device: torch.device) -> None:
        f32 = torch.float32
        self.temperature = StagedWriteTensor((num_rows,), f32, device)
        self.top_k = StagedWriteTensor((num_rows,), torch.int32, device)
        self.top_p = StagedWriteTensor((num_rows,), f32, device)
        self.min_p = StagedWriteTensor((num_rows,), f32, device)
        self.seed = StagedWriteTensor((num_rows,), torch.int64, device)
        self.repetition_penalty = StagedWriteTensor((num_rows,), f32, device)
        self.frequency_penalty = StagedWriteTensor((num_rows,), f32, device)
        self.presence_penalty = StagedWriteTensor((num_rows,), f32, device)
        self.device = torch.device(device)
        self._staged = {
            "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
            "seed": self.seed, "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
        }
        self.host = [RowSampling() for _ in range(num_rows)]
        self.users: dict[str, set[int]] = {s: set() for s in STAGES}

    def tables(self) -> dict[str, torch.Tensor]:
        return {k: t.gpu for k, t in self._staged.items()}

    # host mirrors under their historical names
    @property
    def temperature_cpu(self) -> list[float]:
        return [h.temperature for h in self.host]

    @property
    def top_k_cpu(self) -> list[int]:
        return [h.top_k for h in self.host]

    @property
    def top_p_cpu(self) -> list[float]:
        return [h.top_p for h in self.host]

    # ---- rows -----------------------------------------------------------------------
    def add(self, row: int, req: NewRequest) -> None:
        sp = req.sampling_params
        self.remove(row)
        h = RowSampling(num_prompt_tokens=req.num_prompt_tokens)
        rep, freq, pres = 1.0, 0.0, 0.0
        if sp is not None:
            h.temperature = float(sp.temperature) if sp.temperature >= GREEDY_EPS else 0.0
            h.top_k, h.top_p, h.min_p, h.min_tokens = sp.top_k, float(sp.top_p), float(sp.min_p), sp.min_tokens
            rep, freq, pres = sp.repetition_penalty, sp.frequency_penalty, sp.presence_penalty
            stop_ids = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(req.eos_token_ids))
            h.edits = row_edits(sp.logit_bias, ())
            if sp.min_tokens > 0 and stop_ids:
                h.edits_min_tokens = row_edits(sp.logit_bias, stop_ids)
            h.num_logprobs = -1 if sp.logprobs is None else sp.logprobs
            if sp.prompt_logprobs is not None:
                h.num_prompt_logprobs = sp.prompt_logprobs
                h.prompt_logprobs_next = max(1, req.prompt_logprobs_start)
        for name, value in (("temperature", h.temperature), ("top_k", h.top_k), ("top_p", h.top_p),
                            ("min_p", h.min_p), ("seed", req.seed), ("repetition_penalty", rep),
                            ("frequency_penalty", freq), ("presence_penalty", pres)):
            self._staged[name].stage_scalar(row, value)
        random = h.temperature > 0
        uses = {
            "random": random,
            "cut": random and (h.top_k > 0 or h.top_p < 1.0 or h.min_p > 0.0),
            "cut_k_min_p": random and (h.top_k > 0 or h.min_p > 0.0),
            "edits": h.edits is not None or h.edits_min_tokens is not None,
            "repetition": rep != 1.0,
            "freq_pres": freq != 0.0 or pres != 0.0,
            "logprobs": h.num_logprobs >= 0,
            "prompt_logprobs": h.num_prompt_logprobs >= 0 and h.prompt_logprobs_next < h.num_prompt_tokens,
        }
        for stage, used in uses.items():
            if used:
                self.users[stage].add(row)
        self.host[row] = h

    def remove(self, row: int) -> None:
        for users in self.users.values():
            users.discard(row)
        self.host[row] = RowSampling()

    def apply_staged_writes(self) -> None:
        for t in self._staged.values():
            t.apply_staged_writes()

    # ---- one step -------------------------------------------------------------------
    def in_batch(self, stage: str, rows: list[int]) -> list[int]:
        """Batch positions whose row uses ``stage``."""
        users = self.users[stage]
        if not users or users.isdisjoint(rows):
            return []
        return [i for i, r in enumerate(rows) if r in users]

    def metadata(self, batch: InputBatch, vocab: int, token_ids: torch.Tensor, num_prompt: torch.Tensor
                 ) -> SamplingMetadata:
        """Gather this step's settings. ``token_ids`` / ``num_prompt``: the runner's tables."""
        n = batch.num_reqs
        rows = batch.idx_mapping_cpu[:n].tolist()
        idx = batch.idx_mapping[:n].long()
        t = self.temperature.gpu[idx]
        meta = SamplingMetadata(
            inv_temp=torch.where(t > 0, 1.0 / t, torch.zeros_like(t)), seeds=self.seed.gpu[idx],
            positions=batch.seq_lens[:n],
        )
        meta.any_random = bool(self.in_batch("random", rows))
        if meta.any_random and self.in_batch("cut", rows):
            meta.top_k, meta.top_p = self.top_k.gpu[idx], self.top_p.gpu[idx]
            meta.log_min_p = self.min_p.gpu[idx].log()
            meta.top_p_only = not self.in_batch("cut_k_min_p", rows)
            meta.all_top_p = meta.top_p_only and len(self.in_batch("cut", rows)) == n  # ("cut" rows are random)
        seq_lens = batch.seq_lens_cpu[:n].tolist()
        edit_rows = self.in_batch("edits", rows)
        if edit_rows:
            parts = []
            for i in edit_rows:
                h = self.host[rows[i]]
                masked = h.edits_min_tokens is not None and seq_lens[i] - h.num_prompt_tokens < h.min_tokens
                e = h.edits_min_tokens if masked else h.edits
                if e is not None:
                    parts.append((i, e))
            packed = pack_edits(parts, vocab)
            if packed is not None:
                meta.edits = (host_to_device(packed[0], self.device), host_to_device(packed[1], self.device))
        rep_rows, fp_rows = self.in_batch("repetition", rows), self.in_batch("freq_pres", rows)
        if rep_rows or fp_rows:
            pen = sorted(set(rep_rows) | set(fp_rows))
            length = max(seq_lens[i] for i in pen)
            bi = host_to_device(torch.tensor(pen, dtype=torch.int64), self.device)
            prow = idx[bi]
            meta.penalties = PenaltyInputs(
                batch_idx=bi, token_ids=token_ids[prow, :length], seq_lens=batch.seq_lens[bi],
                num_prompt=num_prompt[prow],
                repetition=self.repetition_penalty.gpu[prow] if rep_rows else None,
                frequency=self.frequency_penalty.gpu[prow] if fp_rows else None,
                presence=self.presence_penalty.gpu[prow] if fp_rows else None,
            )
        lp_rows = self.in_batch("logprobs", rows)
        if lp_rows:
            meta.logprob_rows = [(i, self.host[rows[i]].num_logprobs) for i in lp_rows]
            meta.logprob_idx = host_to_device(torch.tensor(lp_rows, dtype=torch.int64), self.device)
        return meta
