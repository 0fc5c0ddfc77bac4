"""Reward models (task ``reward``, vLLM's ``LLM.reward``): raw scores, no activation by default.

Two shapes, as the model's head defines them:

``RewardModelState`` (sequence rewards: ``LlamaForSequenceClassification`` with
  ``num_labels=1``, the shape of published Llama-3.x reward models): the head reads the
  last prompt token's hidden state, as the classifier does, and a request's output is its
  ``num_labels`` logits; ``PoolingParams(use_activation=True)`` applies the classifier's
  activation. The same model also serves ``classify`` and ``score`` (activated by default):
  everything but the default of ``use_activation`` is ClassifyModelState's.

``TokenRewardModelState`` (per-token rewards: transformers' ``*ForTokenClassification``
  heads, vLLM's ALL pooling for reward): the head runs on every prompt token and a
  request's output is ``[num_prompt_tokens, num_labels]``. Under chunked prefill each
  chunk's rows are scored as the chunk runs and kept per row until the prompt's last chunk.

Per-row state of the per-token shape (initialised on every add, and again whenever a
request's chunk starts at token 0, as after a preemption):
  ``parts``  host list of the scored chunks so far (device tensors [q, num_labels])
"""
from __future__ import annotations

import dataclasses

import torch

from core_runner.sdk import InputBatch, NewRequest, PoolingParams
from model_states.classify import ClassifyModelState


class RewardModelState(ClassifyModelState):
    """A last-token reward head (raw logits by default), also a classifier and a cross-encoder."""

    supported_tasks = ("reward", "classify", "score")


class TokenRewardModelState(ClassifyModelState):
    """A per-token reward head: ``[num_prompt_tokens, num_labels]`` raw scores per request."""

    supported_tasks = ("reward",)

    def __init__(self, config, model, device: torch.device) -> None:
        super().__init__(config, model, device)
        if self.default_pooling_type != "all":
            raise TypeError(f"{type(model).__name__}.default_pooling_type={self.default_pooling_type!r}: a per-token "
                            "reward head pools 'all' (every prompt token)")
        self.parts: list[list[torch.Tensor]] = [[] for _ in range(config.max_num_seqs + 1)]

    def resolve_pooling_params(self, params: PoolingParams | None) -> PoolingParams:
        params = params if params is not None else PoolingParams(task="reward")
        if params.compressed_token_type_ids is not None:
            raise ValueError(f"PoolingParams.compressed_token_type_ids={params.compressed_token_type_ids!r} is "
                             f"invalid for {type(self.model).__name__}: a per-token reward model reads no sentence "
                             "pairs (pass None)")
        return super().resolve_pooling_params(dataclasses.replace(params, task=params.task or "reward"))

    def add_request(self, row: int, request: NewRequest) -> None:
        super().add_request(row, request)
        self.parts[row] = []

    def pool(self, hidden_states: torch.Tensor, batch: InputBatch) -> list[torch.Tensor | None]:
        """Per request whose prompt ends in this step, its prompt's scores [num_prompt, num_labels]
        (float32; activated where the request asked); None for the others. No host read of device data."""
        n = batch.num_reqs
        rows = batch.idx_mapping_cpu[:n].tolist()
        computed = batch.num_computed_cpu[:n].tolist()
        seq = batch.seq_lens_cpu[:n].tolist()
        qsl = batch.query_start_loc_cpu[: n + 1].tolist()
        t = qsl[n]
        scores = self.model.classify(hidden_states[:t]).float()  # one head call for every token of the step
        out: list[torch.Tensor | None] = [None] * n
        for i, row in enumerate(rows):
            if computed[i] == 0:  # a prompt's first chunk: restart the row whatever it holds
                self.parts[row] = []
            self.parts[row].append(scores[qsl[i]: qsl[i + 1]])
            if seq[i] != self.num_prompt_cpu[row]:
                continue
            raw = torch.cat(self.parts[row]) if len(self.parts[row]) > 1 else self.parts[row][0]
            self.parts[row] = []
            if len(raw) != self.num_prompt_cpu[row]:
                raise RuntimeError(f"request {batch.req_ids[i]!r}: {len(raw)} scored tokens for a prompt of "
                                   f"{self.num_prompt_cpu[row]} (a chunk was missed)")
            activated = torch.sigmoid(raw) if self.activation == "sigmoid" else torch.softmax(raw, dim=-1)
            on = self.activate.gpu[batch.idx_mapping[i: i + 1].long()].bool()
            out[i] = torch.where(on, activated, raw)
        return out
