"""Pooling corpus bugs: the pooling plugin's BERT model and the embedding ModelState, each
with one bug of the kind a plugin author writes and the registered examples and checks
hide (BERT's examples all use eps 1e-12 and exact GELU; chunked prefill is compared for
one pooling type only, in fresh rows).

``LoopPooling`` is ``PoolingModelState.pool`` as an author might write it, per request on
the host; it is correct (``loop_pooling`` registers it and passes), and the chunked-prefill
bugs are one-method changes of it."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from core_runner_pooling.bert import BertModel

from core_runner.sdk import POOLING_TYPES
from model_states.pooling import CLS, MEAN, PoolingModelState


def _whole(kind: int, h: torch.Tensor) -> torch.Tensor:
    return h.mean(dim=0) if kind == MEAN else (h[0] if kind == CLS else h[-1])


class LoopPooling(PoolingModelState):
    """A prompt that starts and ends in one step is pooled from that step's hidden states;
    a chunked one carries the mean's running sum, or the first token's hidden state, in
    ``acc`` (which the base class zeroes when a request takes the row)."""

    def pool(self, hidden_states: torch.Tensor, batch) -> list[torch.Tensor | None]:
        n = batch.num_reqs
        qsl = batch.query_start_loc_cpu[: n + 1].tolist()
        out: list[torch.Tensor | None] = []
        for i in range(n):
            row, start = int(batch.idx_mapping_cpu[i]), int(batch.num_computed_cpu[i])
            h = hidden_states[qsl[i]: qsl[i + 1]].float()
            kind, ends = self.pool_type_cpu[row], int(batch.seq_lens_cpu[i]) == self.num_prompt_cpu[row]
            if start == 0 and ends:
                v = _whole(kind, h)
            else:
                self.carry(row, kind, start, h)
                v = self.finish_chunked(row, kind, h) if ends else None
            if v is not None and int(self.normalize.gpu[row]):
                v = F.normalize(v, p=2.0, dim=-1)
            out.append(v)
        return out

    def carry(self, row: int, kind: int, start: int, h: torch.Tensor) -> None:
        if kind == MEAN:
            self.acc[row] = h.sum(dim=0) if start == 0 else self.acc[row] + h.sum(dim=0)
        elif kind == CLS and start == 0:
            self.acc[row] = h[0]

    def finish_chunked(self, row: int, kind: int, h: torch.Tensor) -> torch.Tensor:
        """The vector of a chunked prompt, in the step of its last chunk (``h``)."""
        if kind == MEAN:
            return self.acc[row] / self.num_prompt_cpu[row]
        return self.acc[row].clone() if kind == CLS else h[-1]


class MeanOfLastChunk(LoopPooling):
    """Mean pooling of a chunked prompt averages its last chunk only."""

    def finish_chunked(self, row: int, kind: int, h: torch.Tensor) -> torch.Tensor:
        return h.mean(dim=0) if kind == MEAN else super().finish_chunked(row, kind, h)


class ClsOfLastChunk(LoopPooling):
    """CLS pooling of a chunked prompt takes the first token of its last chunk."""

    def finish_chunked(self, row: int, kind: int, h: torch.Tensor) -> torch.Tensor:
        return h[0] if kind == CLS else super().finish_chunked(row, kind, h)


class StaleAccumulator(LoopPooling):
    """Adds every chunk's sum into ``acc``, relying on it starting at zero, and never zeroes a
    row for a new request: right in a row's first request, wrong for a chunked mean in a
    reused row."""

    def carry(self, row: int, kind: int, start: int, h: torch.Tensor) -> None:
        if kind == MEAN:
            self.acc[row] += h.sum(dim=0)
        else:
            super().carry(row, kind, start, h)

    def apply_staged_writes(self) -> None:
        self._rows_to_clear.clear()
        super().apply_staged_writes()


class NormalizeStagedOnlyWhenSet(PoolingModelState):
    """add_request writes a row's normalize flag only when the request asks for it, so a
    request that does not keeps the flag of the row's previous request."""

    def add_request(self, row: int, request) -> None:
        params = self.resolve_pooling_params(request.pooling_params)
        kind = POOLING_TYPES.index(params.pooling_type)
        self.pool_type.stage_scalar(row, kind)
        if params.normalize:
            self.normalize.stage_scalar(row, 1)
        self.num_prompt.stage_scalar(row, request.num_prompt_tokens)
        self.num_prompt_cpu[row] = request.num_prompt_tokens
        self.pool_type_cpu[row] = kind
        self._rows_to_clear.append(row)


class LayerNormEpsHardcoded(BertModel):
    """Every LayerNorm uses eps 1e-12 (BERT's published value), not layer_norm_eps."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.layer_norm_eps = 1e-12
        super().__init__(config)


class ExactGeluAlways(BertModel):
    """The exact erf GELU whatever hidden_act says (gelu_new, gelu_pytorch_tanh, ...)."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.hidden_act = "gelu"
        super().__init__(config)
