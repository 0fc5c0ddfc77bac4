"""LLMEngine: builds the engine (plugin -> model -> runner -> KV pool -> scheduler) and
joins its three parts: the InputProcessor (prompts -> validated Requests), the EngineCore
(schedule -> execute -> update) and the OutputProcessor (Requests -> RequestOutputs).
``engine.debug`` is the inspection API for tests and the conformance suite."""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import torch

from core_runner.config import EngineConfig
from core_runner.distributed import use_tp_group
from core_runner.engine.debug import EngineDebug
from core_runner.engine.defaults import (
    MemoryProbe,
    check_device,
    choose_cpu_threads,
    fit_max_num_seqs,
    kv_cache_budget,
    load_generation_defaults,
    pooling_batch_tokens,
    read_memory,
    resolve_dtype,
)
from core_runner.engine.engine_core import EngineCore
from core_runner.engine.input_processor import InputProcessor, Prompt
from core_runner.engine.output_processor import OutputProcessor
from core_runner.engine.outputs import RequestOutput
from core_runner.engine.request import Request
from core_runner.engine.scheduler import Scheduler
from core_runner.executor.build import RankSpec, build_runner, resolve_mamba_block_size
from core_runner.executor.draft import resolve_draft
from core_runner.executor.multiproc import MultiprocRunner
from core_runner.kv_cache_spec import PagedCacheSpec, RowStateSpec
from core_runner.loader import (
    architecture_of,
    check_footprint,
    estimate_footprint,
    load_hf_config,
    load_tokenizer,
    resolve_model,
    resolve_tokenizer,
)
from core_runner.logits_processor import installed_processors, resolve_processor
from core_runner.oracle import check_config, check_quantization, plan_execution
from core_runner.plugins import PluginManager, load_plugins
from core_runner.pooling_params import PoolingParams
from core_runner.quantization import quantization_from_config
from core_runner.runner.model_runner import ModelRunner
from core_runner.sampling_params import SamplingParams
from core_runner.step_data.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)

# how long rank 0 waits for every rank (and node) to join the tensor-parallel group
_RENDEZVOUS_TIMEOUT_S = 600.0


def available_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes: the CUDA device's, or the host's MemAvailable and MemTotal."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    info = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    free = info.get("MemAvailable", 4 << 30)
    return free, info.get("MemTotal", free)


def usable_positions(registration, hf_config) -> int | None:
    """Tokens a model can place, when its class says it is fewer than max_position_embeddings
    (a classmethod ``max_positions_of(hf_config)``: e.g. positions that start past a padding
    index); None when the class does not say."""
    fn = getattr(registration.load_model_class(), "max_positions_of", None)
    return fn(hf_config) if callable(fn) else None


class LLMEngine:
    """One model's engine. ``memory_probe(device) -> (free, total) bytes`` (or free bytes
    alone) replaces the default memory reading when the KV pool is sized from memory
    (tests inject one).

    Threads: ``add_request``, ``abort_request`` and ``step`` hold ``lock`` (re-entrant), and
    ``LLM.generate`` / ``embed`` hold it for their whole call, so calls from several threads
    are serialized, never interleaved within a step."""

    def __init__(
        self, config: EngineConfig, plugins: PluginManager | None = None, *,
        memory_probe: MemoryProbe | None = None, logits_processors: list | tuple = (),
    ) -> None:
        self._logits_processor_specs = list(logits_processors)
        self.config = config
        check_device(config.device)
        # before any weight is read: loading runs on the same threads
        self.cpu_threads = choose_cpu_threads(config.device, config.tensor_parallel_size // config.nnodes)
        self.plugins = plugins or load_plugins(strict=config.strict)
        self.model_path = resolve_model(config.model, config.revision)
        self.hf_config = load_hf_config(self.model_path, served=self.plugins.registry.find)
        self.generation_defaults = load_generation_defaults(self.model_path, self.hf_config, config.generation_config)
        self.architecture = architecture_of(self.hf_config)
        self.registration = self.plugins.registry.get(self.architecture)
        self.plan = plan_execution(config, self.registration)
        check_quantization(self.hf_config, self.registration)  # before any weight is read
        check_config(self.hf_config, self.registration)
        max_pos = getattr(self.hf_config, "max_position_embeddings", None)
        if max_pos is not None and config.max_model_len > max_pos:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the model's max_position_embeddings={max_pos}"
            )
        usable = usable_positions(self.registration, self.hf_config)
        if usable is not None and config.max_model_len > usable:
            raise ValueError(
                f"max_model_len={config.max_model_len} exceeds the {usable} tokens {self.architecture} can place "
                f"(its model's max_positions_of(config)); pass max_model_len <= {usable}"
            )
        self.dtype = resolve_dtype(config.dtype, self.hf_config, config.device)
        # before anything is allocated: weights that cannot fit are refused by their sizes
        share = config.tensor_parallel_size if config.device.startswith("cuda") else config.nnodes
        quant = quantization_from_config(self.hf_config) if config.load_format != "dummy" else None
        fp = estimate_footprint(self.registration.load_model_class(), self.hf_config, self.dtype, quant)
        check_footprint(fp, self.hf_config, self.dtype, config.device,
                        available_memory(torch.device(config.device))[0], share)
        if fp is not None and fp.state_bytes_per_row:
            free, total = read_memory(memory_probe or available_memory, torch.device(config.device))
            self._fit_max_num_seqs(fp, free, total, share)
        # after the row fit, which chooses the token budget again when it lowers max_num_seqs
        self._raise_pooling_budget()
        config = self.config
        draft = resolve_draft(config, self.plugins.registry, self.architecture, str(self.model_path), self.hf_config)
        spec = RankSpec(config, self.registration, self.plan, self.hf_config, str(self.model_path), self.dtype,
                        self.architecture, draft)
        # what the core calls: rank 0's runner alone, or the tensor-parallel ranks through it
        self.executor: ModelRunner | MultiprocRunner
        if config.tensor_parallel_size > 1:
            self.executor = MultiprocRunner.start(
                config.tensor_parallel_size, config.nnodes, config.master_addr, config.master_port, config.device,
                config.enable_expert_parallel, timeout_s=_RENDEZVOUS_TIMEOUT_S, threads=self.cpu_threads,
                preload=[type(self.hf_config).__module__, self.registration.model.split(":")[0]],
            )
            try:
                self.executor.broadcast_spec(spec)
                with use_tp_group(self.executor.group):
                    self.executor.runner = build_runner(spec)
                self.runner = self.executor.runner
                self._finish_build(memory_probe)
            except BaseException:
                self.executor.shutdown()
                raise
        else:
            self.runner = self.executor = build_runner(spec)
            self._finish_build(memory_probe)

    def _raise_pooling_budget(self) -> None:
        """A pooling-only model on a GPU whose max_num_batched_tokens the engine chose gets
        vLLM's pooling budget (``pooling_batch_tokens``); the plan is made again."""
        c = self.config
        tokens = pooling_batch_tokens(c, self.registration.tasks)
        if tokens == c.max_num_batched_tokens:
            return
        logger.info("max_num_batched_tokens %d -> %d: %s only pools, and a pooling step has no decode rows to keep "
                    "short (vLLM's pooling budget; pass max_num_batched_tokens to choose)", c.max_num_batched_tokens,
                    tokens, self.architecture)
        self._reconfigure(max_num_batched_tokens=tokens)

    def _reconfigure(self, **changes: Any) -> None:
        """The config with ``changes`` (which limits the engine chose stays recorded) and the
        plan made again for it."""
        c = self.config
        self.config = dataclasses.replace(c, **changes)
        object.__setattr__(self.config, "_chosen_limits", c._chosen_limits)
        self.plan = plan_execution(self.config, self.registration)

    def _fit_max_num_seqs(self, fp: Any, free: int, total: int, share: int) -> None:
        """Lower an engine-chosen max_num_seqs that the model's per-row state would not fit
        (``fit_max_num_seqs``); the plan is made again for the new config."""
        c = self.config
        seqs = fit_max_num_seqs(c, fp.state_bytes_per_row // share, fp.snapshot_bytes_per_row // share,
                                fp.kv_bytes_per_token // share, self.plan.prefix_caching, fp.bytes // share, free,
                                total)
        if seqs == c.max_num_seqs:
            return
        tokens = c.max_num_batched_tokens if not c._chosen_limits[1] else None
        logger.info("max_num_seqs %d -> %d: %s keeps %.1f MiB of per-row state a request row, and more rows (with "
                    "their snapshots and full-length KV) would not fit the cache memory (pass max_num_seqs to choose)",
                    c.max_num_seqs, seqs, self.architecture, fp.state_bytes_per_row / 2**20)
        self._reconfigure(max_num_seqs=seqs, max_num_batched_tokens=tokens)

    def _install_logits_processors(self) -> None:
        """Every processor installed by entry point, then those given, built once (vLLM's V1 shape)."""
        classes = installed_processors() + [resolve_processor(s) for s in self._logits_processor_specs]
        if not classes:
            return
        if "generate" not in self.tasks:
            raise ValueError(f"logits processors {[c.__name__ for c in classes]} need a generating model; "
                             f"{self.architecture} supports {self.tasks}")
        if self.config.speculative_config is not None:
            raise ValueError(f"logits processors {[c.__name__ for c in classes]} are not supported with "
                             "speculative_config: verification samples several positions of one request per step")
        device = torch.device(self.config.device)
        procs = [c(self.config, device, device.type == "cuda") for c in classes]
        self.runner.sampling.plugins.processors = procs
        logger.info("logits processors: %s", [type(p).__name__ for p in procs])

    def _finish_build(self, memory_probe: MemoryProbe | None) -> None:
        config = self.config
        max_pos = getattr(self.hf_config, "max_position_embeddings", None)
        self.model, self.model_state = self.runner.model, self.runner.model_state
        state_cls = type(self.model_state)
        self.memory_probe = memory_probe or available_memory
        self._check_state_snapshot_options()
        self.num_blocks = self._kv_pool_blocks()
        one = self.blocks_per_request()
        if self.num_blocks < one:
            raise ValueError(
                f"num_kv_blocks={self.num_blocks} cannot hold one request of max_model_len={config.max_model_len} "
                f"(needs {one} blocks of {config.block_size}); raise num_kv_blocks or lower max_model_len"
            )
        self.executor.initialize_kv_cache(self.num_blocks)
        self.executor.capture_graphs()
        scheduler = Scheduler(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len, block_size=config.block_size, num_blocks=self.num_blocks,
            chunked_prefill=self.plan.chunked_prefill, enable_prefix_caching=self.plan.prefix_caching,
            num_speculative_tokens=self.plan.num_speculative_tokens,
            num_lookahead_tokens=self.plan.num_speculative_tokens if self.runner.drafter is not None else 0,
            kv_cache_windows=[g.sliding_window for g in self.runner.kv_layout.groups],
            mamba_block_size=resolve_mamba_block_size(config), mamba_cache_slots=self.runner.state_snapshot_slots,
        )
        self.core = EngineCore(scheduler, self.executor, self.plan.async_scheduling)
        self.tokenizer = load_tokenizer(resolve_tokenizer(config, self.model_path))
        self.tasks = tuple(state_cls.supported_tasks)
        self.input_processor = InputProcessor(
            config, architecture=self.architecture, tasks=self.tasks, tokenizer=self.tokenizer,
            vocab_size=int(getattr(self.hf_config, "vocab_size", 0)) or None,
            eos_token_ids=self.generation_defaults.eos_token_ids, max_positions=max_pos,
            chunked_prefill=self.plan.chunked_prefill,
            resolve_pooling=getattr(self.model_state, "resolve_pooling_params", None),
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self._install_logits_processors()
        self.lock = threading.RLock()
        # outputs of requests added here that finished while LLM.generate was stepping the
        # engine for its own: kept for the next ``step()``, their owner's
        self._held: list[RequestOutput] = []
        self.debug = EngineDebug(self)
        logger.info("engine ready: %s via plugin %r, %d KV blocks of %d tokens, plan %s",
                    self.architecture, self.registration.plugin, self.num_blocks, config.block_size, self.plan)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``reset_prefix_cache``): later requests compute
        their prompts again; running requests keep their blocks. True when caching is on."""
        with self.lock:
            self.scheduler.reset_prefix_cache()
            return self.plan.prefix_caching

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers and leave their group (nothing to do for one rank);
        also happens when the engine is garbage-collected or the process exits."""
        if isinstance(self.executor, MultiprocRunner):
            self.executor.shutdown()

    def default_sampling_params(self) -> SamplingParams:
        """vLLM's defaults with the checkpoint's generation_config.json values applied
        (generation_config="auto"); plain ``SamplingParams()`` with "vllm"."""
        return self.generation_defaults.sampling_params()

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def vocab_size(self) -> int | None:
        return self.input_processor.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.input_processor.eos_token_ids

    # ---- memory -------------------------------------------------------------------
    def memory_report(self) -> dict[str, int]:
        """kv_bytes_per_token: every paged layer's entry for one token (what attention reads
        per token of context); kv_pool_bytes_per_token: what a block id costs per token
        (less when KV cache groups share memory, kv_cache_groups.py); both 0, with
        kv_cache_groups 0, for a model without paged layers."""
        specs = self.runner.cache_specs()
        per_token = sum(s.bytes_per_token() for s in specs if isinstance(s, PagedCacheSpec))
        per_row = sum(s.bytes_per_row() for s in specs if isinstance(s, RowStateSpec))
        pool_per_token = self.runner.kv_layout.pool_bytes_per_token(specs)
        slots = self.runner.state_snapshot_slots
        snap_row = sum(s.persistent().bytes_per_row() for s in specs if isinstance(s, RowStateSpec))
        return {"kv_bytes_per_token": per_token, "kv_pool_bytes_per_token": pool_per_token,
                "state_bytes_per_row": per_row, "num_blocks": getattr(self, "num_blocks", 0),
                "kv_cache_groups": self.runner.kv_layout.num_groups,
                "state_snapshot_slots": slots, "state_snapshot_bytes": slots * snap_row}

    def _check_state_snapshot_options(self) -> None:
        """mamba_block_size / mamba_cache_slots given to an engine that keeps no row-state
        snapshots (no row state, or prefix caching off) would do nothing: refused."""
        if self.runner.state_snapshot_slots:
            return
        stateless = not self.memory_report()["state_bytes_per_row"]
        why = f"{self.architecture} keeps no per-row recurrent state" if stateless else "prefix caching is off"
        for name in ("mamba_block_size", "mamba_cache_slots"):
            v = getattr(self.config, name)
            if v is not None:
                raise ValueError(f"{name}={v}: {why}, so no row-state snapshots are kept; leave it None")

    def blocks_per_request(self) -> int:
        """The most blocks one request can hold at once: a full group covers max_model_len,
        a windowed one its window plus a step's tokens (and speculation's rollback margin);
        0 without KV cache groups (no paged layer)."""
        c = self.config
        total = 0
        for g in self.runner.kv_layout.groups:
            if g.sliding_window is None:
                total += c.max_blocks_per_req
            else:
                span = g.sliding_window - 1 + self.plan.num_speculative_tokens + c.max_num_batched_tokens
                total += min(c.max_blocks_per_req, -(-span // c.block_size) + 1)
        return total

    def _kv_pool_blocks(self) -> int:
        """num_kv_blocks, or the pool sized from memory. A model without paged layers
        (attention-free: every cache is per-row state) has no pool: 0 blocks, and a
        num_kv_blocks asked for is refused, since nothing could honour it."""
        c = self.config
        if c.num_kv_blocks is not None and not self.runner.kv_layout.num_groups:
            raise ValueError(
                f"num_kv_blocks={c.num_kv_blocks}: {self.architecture} has no paged KV cache (no attention layer; its "
                f"state is per request row, max_num_seqs={c.max_num_seqs} rows); leave num_kv_blocks=None"
            )
        return c.num_kv_blocks or self._blocks_from_memory()

    def _blocks_from_memory(self) -> int:
        rep = self.memory_report()
        c = self.config
        # the rows' state and its prefix-cache snapshots
        row_bytes = rep["state_bytes_per_row"] * (c.max_num_seqs + 1) + rep["state_snapshot_bytes"]
        activations = self._profile_activation_bytes()
        free, total = read_memory(self.memory_probe, torch.device(c.device))
        # the ranks of a node share its host memory; each GPU rank has its own device memory
        sharing = c.tensor_parallel_size // c.nnodes if c.device == "cpu" else 1
        budget = kv_cache_budget(c, free, total, activations) // sharing - row_bytes
        if not rep["kv_cache_groups"]:  # no paged layer: the row state is all there is to fit
            if budget < 0:
                knob = "gpu_memory_utilization" if c.gpu_memory_utilization is not None else "kv_cache_memory_fraction"
                raise ValueError(
                    f"the per-row state of max_num_seqs={c.max_num_seqs} (+1 scratch) rows needs "
                    f"{row_bytes / 2**20:.1f} MiB, {-budget / 2**20:.1f} MiB more than {knob}={getattr(c, knob)} "
                    f"leaves ({free / 2**20:.1f} MiB free of {total / 2**20:.1f} MiB); lower max_num_seqs or raise "
                    f"{knob}"
                )
            logger.info("no paged KV cache (no attention layer): no KV pool; row state %.1f MiB", row_bytes / 2**20)
            return 0
        block_bytes = max(1, rep["kv_pool_bytes_per_token"] * c.block_size)
        useful = c.max_num_seqs * self.blocks_per_request()  # more blocks than this can never be used
        n = min(useful, budget // block_bytes)
        if row_bytes and n < self.blocks_per_request():  # the rows' state left the pool too little
            fits = max(0, (budget + row_bytes) // 2) // max(1, row_bytes // (c.max_num_seqs + 1))
            raise ValueError(
                f"max_num_seqs={c.max_num_seqs}: the per-row state of that many rows (+1 scratch) and its "
                f"{rep['state_snapshot_slots']} prefix-cache snapshots needs {row_bytes / 2**30:.2f} GiB, which "
                f"leaves the KV pool {max(budget, 0) / 2**30:.2f} GiB, less than one request of "
                f"max_model_len={c.max_model_len} needs; lower max_num_seqs (about {fits} rows leave half the "
                "cache memory to the pool) or mamba_cache_slots"
            )
        logger.info("KV pool sized from memory: %d blocks (%.1f MiB; %.1f MiB free of %.1f MiB, activation peak "
                    "%.1f MiB)", n, n * block_bytes / 2**20, free / 2**20, total / 2**20, activations / 2**20)
        return max(n, 0)

    def _profile_activation_bytes(self) -> int:
        """The allocation peak of one dummy step of max_num_batched_tokens (CUDA only: the
        host has no peak counter), run over a pool of one request's blocks and the rows'
        state. Those caches are released before the free memory is read: a model's row state
        for every row (and its snapshots) is as large as the pool can be, and counting it
        as in use and again as ``row_bytes`` left granite-4.0-h-350m no block at 1,024 rows."""
        device = self.runner.device
        if device.type != "cuda":
            return 0
        c = self.config
        self.executor.initialize_kv_cache(c.max_blocks_per_req)
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        n = min(c.max_num_seqs, c.max_num_batched_tokens)
        so = SchedulerOutput(num_scheduled_tokens={f"profile{i}": 1 for i in range(n)})
        so.num_scheduled_tokens[f"profile{n - 1}"] += c.max_num_batched_tokens - n
        self.executor.execute_model(so, dummy=True)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        self.executor.release_kv_caches()
        torch.cuda.empty_cache()
        return max(0, int(peak))

    # ---- requests -----------------------------------------------------------------
    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, req_id: str | None = None,
        pooling_params: PoolingParams | None = None,
    ) -> str:
        """Validate and queue one request; a bad one raises here and leaves the others untouched.
        ``prompt``: a str, a list of int token ids, ``{"prompt": str}`` or
        ``{"prompt_token_ids": list[int]}``. A generation request without params gets
        ``default_sampling_params()``."""
        if params is None and pooling_params is None and "generate" in self.tasks:
            params = self.default_sampling_params()
        with self.lock:  # the InputProcessor's id counter and seed RNG are shared
            return self.add_processed(self.input_processor.process(prompt, params, req_id, pooling_params))

    def add_processed(self, req: Request) -> str:
        """Queue a Request the InputProcessor made (``LLM`` validates a whole batch first)."""
        with self.lock:
            self.output_processor.add_request(req)
            self.core.add_request(req)
        return req.req_id

    def abort_request(self, req_id: str) -> None:
        with self.lock:
            self.core.abort(req_id)

    def has_unfinished_requests(self) -> bool:
        """True while a request runs or a finished one's output is still to be returned by
        ``step()``."""
        return self.core.has_unfinished() or bool(self._held)

    def step(self) -> list[RequestOutput]:
        """Launch one step; return the requests finished by the oldest step in flight (after
        any that finished while ``LLM.generate`` stepped the engine)."""
        with self.lock:
            held, self._held = self._held, []
            return held + self.step_core()

    def step_core(self) -> list[RequestOutput]:
        """One step's finished outputs only (``LLM`` keeps the others' with ``hold``)."""
        with self.lock:
            return [self.output_processor.make_output(r) for r in self.core.step()]

    def hold(self, outputs: list[RequestOutput]) -> None:
        """Keep outputs for the next ``step()`` (their owner added them at the engine level)."""
        with self.lock:
            self._held.extend(outputs)

    def dummy_run(self, num_reqs: int, num_tokens: int) -> None:
        self.core.dummy_run(num_reqs, num_tokens)
