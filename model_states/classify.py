"""ClassifyModelState: sequence classifiers and cross-encoders (tasks ``classify`` and ``score``).

A request runs its prompt and finishes with one probability vector: the prompt is pooled
as the model's head pools it (``default_pooling_type``: CLS for BERT's pooler, last for
a decoder's), the model's ``classify(pooled [n, hidden]) -> logits [n, num_labels]``
applies the head, and the activation follows the checkpoint as transformers' loss does:
sigmoid when ``num_labels == 1`` or ``problem_type == "multi_label_classification"``,
else softmax over the labels (``PoolingParams(use_activation=False)``: the raw logits).

Everything else is PoolingModelState's: rows, chunk carry, the prompt-whole rule of
bidirectional models. Per-row state added here (initialised on every add):
  ``activate``    1 to apply the activation
  ``type_start``  host only: the first token of a sentence pair's second segment
                  (``PoolingParams.compressed_token_type_ids``), or None; a model that
                  declares ``uses_token_type_ids`` gets ``token_type_ids`` [T] built from it
"""
from __future__ import annotations

import dataclasses

import torch

from core_runner.sdk import InputBatch, NewRequest, PoolingParams, StagedWriteTensor
from model_states.pooling import PoolingModelState


def head_activation(config) -> str:
    """"sigmoid" or "softmax", as transformers' sequence classifiers read the config."""
    labels = int(getattr(config, "num_labels", None) or len(getattr(config, "id2label", None) or {}) or 2)
    if labels == 1 or getattr(config, "problem_type", None) == "multi_label_classification":
        return "sigmoid"
    return "softmax"


class ClassifyModelState(PoolingModelState):
    supported_tasks = ("classify", "score")

    def __init__(self, config, model, device: torch.device) -> None:
        super().__init__(config, model, device)
        if not callable(getattr(model, "classify", None)):
            raise TypeError(f"{type(model).__name__} must define classify(pooled) -> logits to serve 'classify'")
        hf = getattr(model, "config", None)
        if hf is None:
            raise TypeError(f"{type(model).__name__} must keep its config (self.config) for its labels")
        self.activation = head_activation(hf)
        self.uses_token_types = bool(getattr(model, "uses_token_type_ids", False))
        rows = config.max_num_seqs + 1
        self.activate = StagedWriteTensor((rows,), torch.int32, device)
        self.type_start_cpu: list[int | None] = [None] * rows

    def resolve_pooling_params(self, params: PoolingParams | None) -> PoolingParams:
        params = params if params is not None else PoolingParams(task="classify")
        own = self.default_pooling_type
        if params.dimensions is not None:
            raise ValueError(f"PoolingParams.dimensions={params.dimensions!r} is invalid for task "
                             f"{params.task or 'classify'!r}: Matryoshka truncation applies to embed only (pass None)")
        if params.pooling_type not in (None, own):
            raise ValueError(f"PoolingParams.pooling_type={params.pooling_type!r} is invalid for "
                             f"{type(self.model).__name__}: its classifier head pools {own!r} (pass None)")
        # the head reads the raw pooled state: never L2-normalised
        if params.pooling_type == own and params.normalize is False:  # resolved already (input processing)
            return params
        return dataclasses.replace(params, pooling_type=own, normalize=False)

    def add_request(self, row: int, request: NewRequest) -> None:
        super().add_request(row, request)
        params = request.pooling_params
        self.activate.stage_scalar(row, int(params.activate))
        self.type_start_cpu[row] = params.compressed_token_type_ids

    def apply_staged_writes(self) -> None:
        super().apply_staged_writes()
        self.activate.apply_staged_writes()

    def row_buffers(self) -> dict[str, torch.Tensor]:
        return {**super().row_buffers(), "activate": self.activate.gpu}

    def prepare_inputs(self, batch: InputBatch) -> dict[str, torch.Tensor]:
        extra = super().prepare_inputs(batch)
        n = batch.num_reqs
        rows = batch.idx_mapping_cpu[:n].tolist()
        if not self.uses_token_types or all(self.type_start_cpu[r] is None for r in rows):
            return extra
        qsl = batch.query_start_loc_cpu[: n + 1].tolist()
        types = torch.zeros(batch.input_ids.shape[0], dtype=torch.int32)
        for i, row in enumerate(rows):
            start = self.type_start_cpu[row]
            if start is None:
                continue
            # positions of this step's tokens: num_computed .. num_computed + q_len
            begin = qsl[i] + max(0, start - int(batch.num_computed_cpu[i]))
            types[begin: qsl[i + 1]] = 1
        extra["token_type_ids"] = types.to(self.device, non_blocking=True)
        return extra

    def pool(self, hidden_states: torch.Tensor, batch: InputBatch) -> list[torch.Tensor | None]:
        """One float32 vector of num_labels probabilities (or logits, when the request turned
        the activation off) per request whose prompt ends in this step, None for the others."""
        pooled = super().pool(hidden_states, batch)
        done = [i for i, v in enumerate(pooled) if v is not None]
        if not done:
            return pooled
        logits = self.model.classify(torch.stack([pooled[i] for i in done]).to(hidden_states.dtype)).float()
        act = torch.sigmoid(logits) if self.activation == "sigmoid" else torch.softmax(logits, dim=-1)
        rows = batch.idx_mapping[: batch.num_reqs].long()[torch.tensor(done, device=logits.device)]
        on = self.activate.gpu[rows].bool().unsqueeze(1)
        out = torch.where(on, act, logits)
        for j, i in enumerate(done):
            pooled[i] = out[j]
        return pooled
