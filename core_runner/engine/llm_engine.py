"""LLMEngine: plugins -> model -> runner -> scheduler, and the request lifecycle."""
from __future__ import annotations

import itertools
import logging
import random
from collections import deque
from typing import Any, Sequence

import torch

from core_runner.attention.backend import get_backend
from core_runner.config import EngineConfig
from core_runner.engine.detokenizer import IncrementalDetokenizer
from core_runner.engine.outputs import RequestOutput
from core_runner.engine.request import Request
from core_runner.engine.scheduler import Scheduler
from core_runner.step_data.scheduler_output import SchedulerOutput
from core_runner.kv_cache_spec import PagedCacheSpec, RowStateSpec
from core_runner.loader import (
    architecture_of, build_model, eos_token_ids, load_hf_config, load_tokenizer, resolve_dtype,
)
from core_runner.oracle import plan_execution
from core_runner.pooling_params import PoolingParams
from core_runner.plugins import PluginManager, load_plugins
from core_runner.runner.async_output import AsyncOutput
from core_runner.runner.model_runner import ModelRunner
from core_runner.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def _available_host_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


class LLMEngine:
    def __init__(self, config: EngineConfig, plugins: PluginManager | None = None) -> None:
        self.config = config
        self.plugins = plugins or load_plugins()
        self.hf_config = load_hf_config(config.model)
        self.architecture = architecture_of(self.hf_config)
        self.registration = self.plugins.registry.get(self.architecture)
        self.plan = plan_execution(config, self.registration)
        max_pos = getattr(self.hf_config, "max_position_embeddings", None)
        if max_pos is not None and config.max_model_len > max_pos:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's max_position_embeddings={max_pos}"
            )
        self.dtype = resolve_dtype(config.dtype, self.hf_config, config.device)
        model_cls = self.registration.load_model_class()
        self.model = build_model(model_cls, self.hf_config, self.dtype, config.device, config.model)
        state_cls = self.registration.load_model_state_class()
        self.model_state = state_cls(config, self.model, torch.device(config.device))
        self.runner = ModelRunner(
            config, self.model, self.model_state, get_backend(self.plan.attention_backend),
            triton_kernels=self.plan.attention_backend == "triton", cuda_graphs=self.plan.cuda_graphs,
        )
        self.num_blocks = config.num_kv_blocks or self._blocks_from_memory()
        if self.num_blocks < config.max_blocks_per_req:
            raise ValueError(
                f"num_kv_blocks={self.num_blocks} cannot hold one request of max_model_len={config.max_model_len} "
                f"(needs {config.max_blocks_per_req} blocks of {config.block_size}); raise num_kv_blocks or "
                "lower max_model_len"
            )
        self.runner.initialize_kv_cache(self.num_blocks)
        self.runner.capture_graphs()
        # async scheduling: step N+1 is launched before step N's tokens are read
        self._in_flight: deque[tuple[SchedulerOutput, AsyncOutput]] = deque()
        self._depth = 1 if self.plan.async_scheduling else 0
        self.scheduler = Scheduler(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len, block_size=config.block_size, num_blocks=self.num_blocks,
            chunked_prefill=self.plan.chunked_prefill,
        )
        self.tokenizer = load_tokenizer(config.tokenizer or config.model)
        self.eos_token_ids = eos_token_ids(config.model, self.hf_config)
        self.vocab_size = int(getattr(self.hf_config, "vocab_size", 0)) or None
        self._seed_rng = random.Random(config.seed)
        self._ids = itertools.count()
        self.tasks = tuple(state_cls.supported_tasks)
        logger.info("engine ready: %s via plugin %r, %d KV blocks of %d tokens, plan %s",
                    self.architecture, self.registration.plugin, self.num_blocks, config.block_size, self.plan)

    # ---- memory -------------------------------------------------------------------
    def memory_report(self) -> dict[str, int]:
        specs = self.model_state.kv_cache_specs()
        per_token = sum(s.bytes_per_token() for s in specs if isinstance(s, PagedCacheSpec))
        per_row = sum(s.bytes_per_row() for s in specs if isinstance(s, RowStateSpec))
        return {"kv_bytes_per_token": per_token, "state_bytes_per_row": per_row,
                "num_blocks": getattr(self, "num_blocks", 0)}

    def _blocks_from_memory(self) -> int:
        rep = self.memory_report()
        c = self.config
        row_bytes = rep["state_bytes_per_row"] * (c.max_num_seqs + 1)
        block_bytes = max(1, rep["kv_bytes_per_token"] * c.block_size)
        if c.device.startswith("cuda"):
            free = torch.cuda.mem_get_info(torch.device(c.device))[0]
        else:
            free = _available_host_bytes()
        budget = int(free * c.kv_cache_memory_fraction) - row_bytes
        useful = c.max_num_seqs * c.max_blocks_per_req  # more blocks than this can never be used
        n = min(useful, budget // block_bytes)
        logger.info("KV pool sized from memory: %d blocks (%.1f MiB of %.1f MiB free)",
                    n, n * block_bytes / 2**20, free / 2**20)
        return max(n, 0)

    # ---- requests -----------------------------------------------------------------
    def tokenize(self, prompt: str | Sequence[int], truncate: int | None = None) -> list[int]:
        """Token ids of a prompt; ``truncate`` cuts a text prompt with the tokenizer's own
        truncation (special tokens kept)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass prompts as lists of token ids")
            if truncate is not None:
                return list(self.tokenizer.encode(prompt, truncation=True, max_length=truncate))
            return list(self.tokenizer.encode(prompt))
        ids = list(prompt)
        if any(not isinstance(t, int) or isinstance(t, bool) for t in ids):
            raise ValueError("a token-id prompt must be a list of ints")
        return ids

    def validate_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if self.vocab_size is not None:
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        limit = self.config.max_model_len - 1
        if len(ids) > limit:
            raise ValueError(
                f"prompt has {len(ids)} tokens but max_model_len={self.config.max_model_len} allows at most "
                f"{limit} (one position is needed for the first generated token)"
            )

    def validate_params(self, params: SamplingParams) -> None:
        """The checks SamplingParams cannot make alone: they need this engine."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if "generate" not in self.tasks:
            raise ValueError(f"{self.architecture} supports tasks {self.tasks}, not 'generate'")
        limit = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > limit:
                raise ValueError(f"SamplingParams.{name}={k} is invalid: expected at most max_logprobs={limit} "
                                 "(raise EngineConfig.max_logprobs)")
        if params.logit_bias and self.vocab_size is not None:
            bad = [t for t in params.logit_bias if t >= self.vocab_size]
            if bad:
                raise ValueError(f"SamplingParams.logit_bias token id {bad[0]} is invalid: expected ids in "
                                 f"[0, {self.vocab_size}) (the vocabulary)")
        if params.stop and self.tokenizer is None:
            raise ValueError(f"SamplingParams.stop={params.stop!r} is invalid: stop strings need a tokenizer, "
                             "and this checkpoint has none (use stop_token_ids)")

    def add_request(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, req_id: str | None = None,
        pooling_params: Any = None,
    ) -> str:
        """Queue one request; a bad one raises here and leaves the others untouched."""
        if params is not None:
            self.validate_params(params)
        if params is None and pooling_params is None and "generate" not in self.tasks:
            pooling_params = PoolingParams()
        if pooling_params is not None:
            if params is not None:
                raise ValueError("a request takes SamplingParams or PoolingParams, not both")
            pooling_params = self.check_pooling_params(pooling_params)
            ids = self.pooling_prompt(prompt, pooling_params)
        else:
            params = params if params is not None else SamplingParams()
            ids = self.tokenize(prompt)
            self.validate_prompt(ids)
        seed = params.seed if params is not None and params.seed is not None else self._seed_rng.getrandbits(63)
        req_id = req_id if req_id is not None else str(next(self._ids))
        detok = IncrementalDetokenizer(self.tokenizer, params.stop) if params is not None and params.stop else None
        self.scheduler.add_request(Request(
            req_id=req_id, prompt_token_ids=ids, sampling_params=params, seed=seed,
            eos_token_ids=self.eos_token_ids, pooling_params=pooling_params, detokenizer=detok,
        ))
        return req_id

    # ---- pooling (embedding) requests --------------------------------------------------
    # One model per engine: an engine whose model embeds takes only pooling requests and a
    # generating one only sampling requests, so a batch never mixes the two.
    def check_pooling_params(self, pooling_params: Any) -> PoolingParams:
        """The request's PoolingParams with the model's default pooling type filled in."""
        if not isinstance(pooling_params, PoolingParams):
            raise TypeError(f"pooling_params must be PoolingParams, got {type(pooling_params).__name__}")
        if "embed" not in self.tasks:
            raise ValueError(
                f"{self.architecture} supports tasks {self.tasks}, not 'embed': pooling requests need an "
                "embedding model (one model per engine; start a second engine for embeddings)"
            )
        resolve = getattr(self.model_state, "resolve_pooling_params", None)
        return resolve(pooling_params) if resolve is not None else pooling_params

    def pooling_prompt_limit(self) -> int:
        """Most tokens a pooling prompt may hold: max_model_len (no generated token follows),
        less one where chunked prefill is on (the scheduler never continues a request that
        has reached max_model_len)."""
        c = self.config.max_model_len
        return c - 1 if self.plan.chunked_prefill else c

    def pooling_prompt(self, prompt: str | Sequence[int], pp: PoolingParams) -> list[int]:
        """Token ids of a pooling prompt, truncated (text) and validated."""
        limit = self.pooling_prompt_limit()
        k = pp.truncate_prompt_tokens
        k = limit if k == -1 else k
        ids = self.tokenize(prompt, truncate=k if isinstance(prompt, str) else None)
        if k is not None and len(ids) > k:
            raise ValueError(
                f"prompt has {len(ids)} token ids but truncate_prompt_tokens={k}: token-id prompts are not cut "
                "(only text prompts are truncated, by the tokenizer)"
            )
        self._validate_pooling_prompt(ids)
        return ids

    def _validate_pooling_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if self.vocab_size is not None:
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        limit = self.pooling_prompt_limit()
        if len(ids) > limit:
            max_pos = getattr(self.hf_config, "max_position_embeddings", None)
            why = f"max_model_len={self.config.max_model_len}"
            if max_pos is not None:
                why += f"; {self.architecture} has max_position_embeddings={max_pos}"
            raise ValueError(
                f"prompt has {len(ids)} tokens but this engine embeds at most {limit} ({why}); "
                "shorten it or pass PoolingParams(truncate_prompt_tokens=...) for a text prompt"
            )

    def abort_request(self, req_id: str) -> None:
        self.scheduler.abort(req_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._in_flight)

    def step(self) -> list[RequestOutput]:
        """Launch one step; return the requests finished by the oldest step in flight."""
        out = self.scheduler.schedule()
        if not out.is_empty or out.finished_req_ids or out.preempted_req_ids or out.new_reqs:
            self._in_flight.append((out, self.runner.execute_model(out)))
        finished = []
        while self._in_flight and (len(self._in_flight) > self._depth or out.is_empty):
            done_out, handle = self._in_flight.popleft()
            finished += self.scheduler.update_from_output(done_out, handle.get())
            if out.is_empty:
                break
        return [self._output(r) for r in finished]

    def dummy_run(self, num_reqs: int, num_tokens: int) -> None:
        so = SchedulerOutput(num_scheduled_tokens={f"d{i}": 1 for i in range(num_reqs)})
        so.num_scheduled_tokens[f"d{num_reqs - 1}"] += max(0, num_tokens - num_reqs)
        self.runner.execute_model(so, dummy=True)

    def _output(self, req: Request) -> RequestOutput:
        text = ""
        if req.detokenizer is not None:
            text = req.detokenizer.text  # cut before a stop string
        elif self.tokenizer is not None and req.output_token_ids:
            text = self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        cumulative = None
        if req.logprobs is not None:
            cumulative = sum(lp[t] for lp, t in zip(req.logprobs, req.output_token_ids))
        return RequestOutput(
            req_id=req.req_id, prompt_token_ids=req.prompt_token_ids, token_ids=list(req.output_token_ids),
            text=text, finish_reason=req.finish_reason or "", seed=req.seed,
            num_preemptions=req.num_preemptions, embedding=req.pooled,
            first_token_time=req.first_token_time, finish_time=req.finish_time, stop_reason=req.stop_reason,
            logprobs=req.logprobs, logprob_ranks=req.logprob_ranks, cumulative_logprob=cumulative,
            prompt_logprobs=req.prompt_logprobs,
        )
