"""PoolingModelState: embedding models served by the generic runner, no sampler.

The task is ``embed``: a request runs its prompt and finishes with one vector. The
runner sees ``"generate"`` missing from ``supported_tasks``, skips the LM head and the
sampler, and asks ``pool(hidden_states, batch)`` for the outputs of each step.

Per-row state (initialised on every add; a reused row behaves like a fresh one):
  ``pool_type``   0 mean / 1 cls / 2 last (``PoolingParams.pooling_type``, resolved)
  ``normalize``   1 to L2-normalise the vector
  ``num_prompt``  prompt length, the divisor of mean pooling
  ``acc``         [rows, hidden] float32: the running sum of the hidden states (mean)
                  or the first token's hidden state (cls), carried across the chunks of
                  a chunked prefill. Unused (and untouched) when a request's whole
                  prompt runs in one step.
Host mirrors of ``num_prompt`` decide which requests finish in a step, without reading
the device.

Attention is causal or bidirectional as the model class says (``is_causal``, default
True). A bidirectional model (BERT) must see each prompt whole in one step: its plugin
declares chunked prefill unsupported, so the oracle never plans chunks for it, and
``prepare_inputs`` refuses a partial prompt should one arrive anyway. A causal model
(Qwen3 last-token embedding) may chunk: mean and cls pooling carry ``acc`` across chunks;
last pooling needs only the final chunk.

KV blocks are only used inside the steps of a request's prompt: the request finishes as
soon as its prompt is processed, and the scheduler frees its blocks then.

The model's default pooling type (used when ``PoolingParams.pooling_type`` is None) is
the checkpoint's sentence-transformers ``Pooling`` config when there is one
(``modules.json`` -> ``<path>/config.json``), else the model class's
``default_pooling_type``.

``PoolingParams.dimensions`` (Matryoshka, as vLLM): a model accepts it when its
checkpoint's config.json sets ``is_matryoshka`` or lists ``matryoshka_dimensions``, or
when its class sets ``is_matryoshka = True``; the pooled vector keeps its first k entries
and is L2-normalised after the cut when ``normalize`` is on (host mirror ``dims_cpu``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from core_runner.sdk import (
    POOLING_TYPES,
    AttnMetadata,
    InputBatch,
    KVCacheSpec,
    ModelState,
    NewRequest,
    PoolingParams,
    StagedWriteTensor,
)
from model_states.default import attn_metadata_from_batch, collect_kv_cache_specs

logger = logging.getLogger(__name__)

MEAN, CLS, LAST = (POOLING_TYPES.index(t) for t in ("mean", "cls", "last"))

# sentence-transformers Pooling config key -> our pooling type (None: not implemented)
_ST_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": None,
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
}


class UnsupportedPoolingMode(ValueError):
    """A sentence-transformers pooling mode this state does not implement (max, mean_sqrt_len,
    weightedmean, several at once): only requests relying on the default pooling fail."""


def _read_json(file: Path, what: str) -> object:
    """``file`` parsed; an unreadable file or invalid JSON is a ValueError naming the file, the
    position and what was expected."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}); expected {what}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{file}: cannot be read ({e}); expected {what}") from e


def _module_dir(root: Path, modules: Path, entry: dict) -> Path:
    """``root / entry["path"]``, refused (naming modules.json and the path) unless it is a
    relative path that stays inside the checkpoint: the checkpoint is data, and a path such as
    "../x" or "/etc" would make it read files elsewhere. Checked on the written path, not on
    resolved symlinks: the hub cache links every file of a snapshot to a blob outside it."""
    rel = entry.get("path", "")
    if not isinstance(rel, str):
        raise ValueError(f"{modules}: module {entry.get('name', '?')!r} has path {rel!r}; expected a relative path "
                         "inside the checkpoint directory (a string)")
    norm = os.path.normpath(rel) if rel else "."
    if os.path.isabs(rel) or norm == ".." or norm.startswith(".." + os.sep):
        raise ValueError(f"{modules}: module {entry.get('name', '?')!r} has path {rel!r}, which leaves the checkpoint "
                         f"directory {root}; expected a relative path inside it (e.g. \"1_Pooling\")")
    return root / norm


def sentence_transformers_pooling(path: str | Path) -> str | None:
    """The pooling mode named by a sentence-transformers checkpoint directory; None when
    the directory has no modules.json or no Pooling module in it. A modules.json or Pooling
    config.json that cannot be read (bad JSON, a path leaving the checkpoint, a missing
    file) raises ValueError naming the file; a mode we do not implement, or several at once,
    raises UnsupportedPoolingMode."""
    root = Path(path)
    modules = root / "modules.json"
    if not modules.is_file():
        return None
    entries = _read_json(modules, "a JSON list of sentence-transformers modules")
    if not isinstance(entries, list) or not all(isinstance(m, dict) for m in entries):
        raise ValueError(f"{modules}: the top level is {type(entries).__name__}; expected a JSON list of module "
                         "objects")
    for m in entries:
        if str(m.get("type", "")).endswith(".Pooling"):
            cfg_file = _module_dir(root, modules, m) / "config.json"
            if not cfg_file.is_file():
                raise ValueError(f"{modules}: module {m.get('name', '?')!r} is a Pooling module, but {cfg_file} is "
                                 "missing (an incomplete download?)")
            cfg = _read_json(cfg_file, "a sentence-transformers Pooling config (a JSON object)")
            if not isinstance(cfg, dict):
                raise ValueError(f"{cfg_file}: the top level is {type(cfg).__name__}; expected a sentence-transformers "
                                 "Pooling config (a JSON object)")
            modes = [k for k in _ST_MODES if cfg.get(k)]
            if len(modes) != 1 or _ST_MODES[modes[0]] is None:
                raise UnsupportedPoolingMode(
                    f"{cfg_file}: sentence-transformers pooling {modes or 'none'} is not implemented; "
                    f"pass PoolingParams(pooling_type=...) with one of {POOLING_TYPES}"
                )
            return _ST_MODES[modes[0]]
    return None


def matryoshka_support(path: str | Path, model: object) -> tuple[bool, tuple[int, ...] | None]:
    """(accepts ``dimensions``, the allowed values or None for any in (0, hidden]) from the
    checkpoint's config.json (``is_matryoshka`` / ``matryoshka_dimensions``, vLLM's keys)
    and the model class's ``is_matryoshka``."""
    file = Path(path) / "config.json"
    cfg = _read_json(file, "a transformers config (a JSON object)") if file.is_file() else {}
    cfg = cfg if isinstance(cfg, dict) else {}
    dims = cfg.get("matryoshka_dimensions")
    if dims is not None and (not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims)):
        raise ValueError(f"{file}: matryoshka_dimensions={dims!r} is invalid: expected a list of positive integers")
    on = bool(dims) or bool(cfg.get("is_matryoshka", False)) or bool(getattr(model, "is_matryoshka", False))
    return on, tuple(dims) if dims else None


class PoolingModelState(ModelState):
    supported_tasks = ("embed",)

    def __init__(self, config, model, device: torch.device) -> None:
        super().__init__(config, model, device)
        self.causal = bool(getattr(model, "is_causal", True))
        self.hidden_size = getattr(model, "hidden_size", None)
        if not isinstance(self.hidden_size, int):
            raise TypeError(f"{type(model).__name__} must set an int attribute hidden_size for pooling")
        try:
            self.default_pooling_type: str | None = (
                sentence_transformers_pooling(config.model) or getattr(model, "default_pooling_type", None)
            )
            self._default_error = ""
        except UnsupportedPoolingMode as e:  # only requests that rely on the default fail
            self.default_pooling_type, self._default_error = None, str(e)
        if self.default_pooling_type not in (None, *POOLING_TYPES):
            raise ValueError(f"{type(model).__name__}.default_pooling_type={self.default_pooling_type!r} "
                             f"is invalid: expected one of {POOLING_TYPES}")
        self.matryoshka, self.matryoshka_dims = matryoshka_support(config.model, model)
        rows = config.max_num_seqs + 1  # the runner's rows plus its scratch row
        self.dims_cpu: list[int | None] = [None] * rows
        self.normalize_cpu = [True] * rows
        self.pool_type = StagedWriteTensor((rows,), torch.int32, device)
        self.normalize = StagedWriteTensor((rows,), torch.int32, device)
        self.num_prompt = StagedWriteTensor((rows,), torch.int32, device)
        self.acc = torch.zeros(rows, self.hidden_size, dtype=torch.float32, device=device)
        self.num_prompt_cpu = [0] * rows
        self.pool_type_cpu = [MEAN] * rows
        self._rows_to_clear: list[int] = []  # acc rows of this step's adds, zeroed in one op

    # ---- requests -------------------------------------------------------------------
    def resolve_pooling_params(self, params: PoolingParams | None) -> PoolingParams:
        """Fill in the model's default pooling type; raises ValueError if there is none."""
        params = params if params is not None else PoolingParams()
        if params.use_activation is not None or params.activation is not None:
            raise ValueError(f"PoolingParams.use_activation / activation apply to classify and score, not to "
                             f"task {params.task or 'embed'!r} (embeddings take normalize)")
        if params.dimensions is not None:
            self.check_dimensions(params.dimensions)
        if params.pooling_type == "all":
            raise ValueError(f"PoolingParams.pooling_type='all' is invalid for task {params.task or 'embed'!r}: "
                             "per-token outputs are served by reward models (task 'reward'); an embedding pools "
                             f"one of {[t for t in POOLING_TYPES if t != 'all']}")
        if params.pooling_type is not None:
            return params
        if self.default_pooling_type is None:
            raise ValueError(self._default_error or (
                f"{type(self.model).__name__} has no default pooling type: pass "
                f"PoolingParams(pooling_type=...) with one of {POOLING_TYPES}"))
        return dataclasses.replace(params, pooling_type=self.default_pooling_type)

    def check_dimensions(self, d: int) -> None:
        """Refuse ``PoolingParams.dimensions=d`` unless the model is Matryoshka-trained and d
        is one it allows (a ValueError naming the field, the value and what is valid)."""
        name = type(self.model).__name__
        if not self.matryoshka:
            raise ValueError(f"PoolingParams.dimensions={d!r} is invalid: {name} does not declare Matryoshka "
                             "embeddings (is_matryoshka / matryoshka_dimensions in its config.json), so a "
                             "truncated vector would be a poor embedding; pass dimensions=None")
        if self.matryoshka_dims is not None and d not in self.matryoshka_dims:
            raise ValueError(f"PoolingParams.dimensions={d!r} is invalid: {name} allows only its "
                             f"matryoshka_dimensions {list(self.matryoshka_dims)}")
        if not 0 < d <= self.hidden_size:
            raise ValueError(f"PoolingParams.dimensions={d!r} is invalid: expected 1 .. {self.hidden_size} "
                             f"(the hidden size of {name})")

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        dtype = next(self.model.parameters()).dtype
        return collect_kv_cache_specs(self.model, dtype)

    def add_request(self, row: int, request: NewRequest) -> None:
        if request.sampling_params is not None:
            raise ValueError(f"request {request.req_id!r} asks to generate, but this engine "
                             f"({type(self.model).__name__}) only embeds")
        params = self.resolve_pooling_params(request.pooling_params)
        kind = POOLING_TYPES.index(params.pooling_type)
        self.pool_type.stage_scalar(row, kind)
        self.normalize.stage_scalar(row, int(params.normalize))
        self.num_prompt.stage_scalar(row, request.num_prompt_tokens)
        self.num_prompt_cpu[row] = request.num_prompt_tokens
        self.pool_type_cpu[row] = kind
        self.dims_cpu[row], self.normalize_cpu[row] = params.dimensions, params.normalize
        self._rows_to_clear.append(row)

    def remove_request(self, row: int) -> None:
        return None

    def apply_staged_writes(self) -> None:
        for t in (self.pool_type, self.normalize, self.num_prompt):
            t.apply_staged_writes()
        if self._rows_to_clear:
            self.acc.index_fill_(0, torch.tensor(self._rows_to_clear, device=self.device), 0.0)
            self._rows_to_clear.clear()

    def row_buffers(self) -> dict[str, torch.Tensor]:
        return {"pool_type": self.pool_type.gpu, "normalize": self.normalize.gpu,
                "num_prompt": self.num_prompt.gpu, "acc": self.acc}

    # ---- a step ---------------------------------------------------------------------
    def prepare_inputs(self, batch: InputBatch) -> dict[str, torch.Tensor]:
        if not self.causal:
            n = batch.num_reqs
            rows = batch.idx_mapping_cpu[:n].tolist()
            for i, row in enumerate(rows):
                if int(batch.num_computed_cpu[i]) != 0 or int(batch.seq_lens_cpu[i]) != self.num_prompt_cpu[row]:
                    raise RuntimeError(
                        f"{type(self.model).__name__} attends bidirectionally and needs each prompt whole in one "
                        f"step, but request {batch.req_ids[i]!r} got tokens [{int(batch.num_computed_cpu[i])}, "
                        f"{int(batch.seq_lens_cpu[i])}) of {self.num_prompt_cpu[row]}"
                    )
        return {}

    def prepare_attn(self, batch: InputBatch, *, for_capture: bool = False) -> AttnMetadata:
        return attn_metadata_from_batch(batch, causal=self.causal)

    def prepare_dummy_inputs(self, num_reqs: int, num_tokens: int) -> dict[str, torch.Tensor]:
        return {}

    def postprocess_state(self, batch: InputBatch, sampled: torch.Tensor | None) -> None:
        return None

    def pool(self, hidden_states: torch.Tensor, batch: InputBatch) -> list[torch.Tensor | None]:
        """One float32 vector (on the engine's device) per request whose prompt ends in this
        step, None for the others; in batch order. No host read of device data."""
        n, t = batch.num_reqs, batch.num_tokens
        rows_cpu = batch.idx_mapping_cpu[:n].tolist()
        computed_cpu = batch.num_computed_cpu[:n].tolist()
        seq_cpu = batch.seq_lens_cpu[:n].tolist()
        done = [i for i in range(n) if seq_cpu[i] == self.num_prompt_cpu[rows_cpu[i]]]
        partial = len(done) < n or any(c > 0 for c in computed_cpu)
        kinds = {self.pool_type_cpu[r] for r in rows_cpu}
        if not done and not (partial and kinds - {LAST}):
            return [None] * n
        dev = hidden_states.device
        h = hidden_states[:t].float()
        qsl = batch.query_start_loc[: n + 1].long()
        rows = batch.idx_mapping[:n].long()
        kind = self.pool_type.gpu[rows]
        first = h[qsl[:n]]  # first token of this step's chunk
        if MEAN in kinds:
            q_lens = qsl[1:] - qsl[:-1]
            seg = torch.repeat_interleave(torch.arange(n, device=dev), q_lens, output_size=t)
            sums = torch.zeros(n, h.shape[1], dtype=torch.float32, device=dev).index_add_(0, seg, h)
        else:
            sums = first
        if partial:
            # carry the mean sum and the first token across chunks; a chunk that starts at
            # token 0 restarts the row whatever acc holds
            starts = torch.tensor([c == 0 for c in computed_cpu], device=dev).unsqueeze(1)
            prev = self.acc[rows]
            total = torch.where(starts, sums, prev + sums)
            head = torch.where(starts, first, prev)
            carried = torch.where((kind == MEAN).unsqueeze(1), total, head)
            self.acc.index_copy_(0, rows, carried)
            sums, first = total, head
        if not done:
            return [None] * n
        sel = torch.tensor(done, device=dev)
        kind = kind[sel].unsqueeze(1)
        mean = sums[sel] / self.num_prompt.gpu[rows[sel]].unsqueeze(1).float()
        last = h[qsl[1:][sel] - 1]
        raw = torch.where(kind == MEAN, mean, torch.where(kind == CLS, first[sel], last))
        norm = self.normalize.gpu[rows[sel]].bool().unsqueeze(1)
        out = torch.where(norm, F.normalize(raw, p=2.0, dim=-1), raw)
        pooled: list[torch.Tensor | None] = [None] * n
        for j, i in enumerate(done):
            d = self.dims_cpu[rows_cpu[i]]
            if d is None:
                pooled[i] = out[j]
            else:  # Matryoshka: cut first, then normalise what is kept
                cut = raw[j, :d]
                pooled[i] = F.normalize(cut, p=2.0, dim=-1) if self.normalize_cpu[rows_cpu[i]] else cut
        return pooled
