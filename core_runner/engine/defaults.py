"""Defaults taken from the checkpoint and the device, as vLLM takes them: the dtype, the
sampling defaults of ``generation_config.json``, the memory the KV pool may use and the
CPU's intra-op thread count. (The device and the batch limits are resolved earlier, in
``EngineConfig``.)"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from core_runner.config import EngineConfig
from core_runner.loader import eos_ids, read_json
from core_runner.sampling_params import AtMost, SamplingParams

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# generation_config.json key -> SamplingParams field: the keys vLLM's generation_config="auto" applies
_SAMPLING_KEYS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                  "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def resolve_dtype(name: str, hf_config: Any, device: str) -> torch.dtype:
    """The parameter / KV dtype. An explicit name is used as given. ``"auto"``: float32 on the
    CPU (half-precision matmuls there are slow or missing); on a GPU the checkpoint's
    float16 / bfloat16, and bfloat16 for a float32 (or undeclared) checkpoint, as vLLM
    does: float32 would halve throughput for no accuracy a user of "auto" asked for
    (``dtype="float32"`` keeps it). The choice is logged."""
    if name != "auto":
        return _DTYPES[name]
    declared = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    declared = str(declared).removeprefix("torch.") if declared is not None else None
    if not device.startswith("cuda"):
        chosen, why = torch.float32, "the CPU path runs in float32"
    elif declared in ("float16", "bfloat16"):
        chosen, why = _DTYPES[declared], "the checkpoint's dtype"
    else:
        why = f"the checkpoint declares {declared or 'no dtype'}; dtype='float32' keeps float32"
        chosen = torch.bfloat16
    logger.info("dtype='auto' on %s: %s (%s)", device, str(chosen).removeprefix("torch."), why)
    return chosen


def check_device(device: str) -> None:
    """Refuse a CUDA device this process cannot use, by name, before anything is built
    (torch would raise an AssertionError from its lazy CUDA init, or a RuntimeError from the
    first allocation). ``EngineConfig`` accepts any well-formed name so that plans can be
    computed on a machine without a GPU; an engine needs the device itself."""
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"this torch ({torch.__version__}) is built without CUDA"
        else:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            why = "no CUDA device is visible" + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        raise ValueError(f"device={device!r} cannot be used: {why}; use device='cpu' (or 'auto')")
    index, count = torch.device(device).index, torch.cuda.device_count()
    if index is not None and index >= count:
        raise ValueError(f"device={device!r} cannot be used: {count} CUDA device(s) visible, expected "
                         f"'cuda' or 'cuda:N' with N in 0..{count - 1}")


@dataclass(frozen=True)
class GenerationDefaults:
    """What a checkpoint's generation_config.json says: its EOS ids (also read in
    generation_config="vllm" mode: EOS defines the model's stop, it is not a sampling
    default) and the SamplingParams fields it sets (empty in "vllm" mode)."""

    eos_token_ids: tuple[int, ...] = ()
    sampling: dict[str, Any] = field(default_factory=dict)

    def sampling_params(self) -> SamplingParams:
        """A fresh SamplingParams: vLLM's defaults overridden by the checkpoint's (its
        max_new_tokens stays a default: the engine cuts it to what the context leaves)."""
        sampling = dict(self.sampling)
        if sampling.get("max_tokens") is not None:
            sampling["max_tokens"] = AtMost(sampling["max_tokens"])
        return SamplingParams(**sampling)


def load_generation_defaults(path: str | Path, hf_config: Any, mode: str = "auto") -> GenerationDefaults:
    """Read ``path/generation_config.json`` with transformers' ``GenerationConfig``.

    ``mode="auto"`` keeps the sampling values that differ from transformers' defaults (vLLM
    reads ``to_diff_dict()`` the same way): temperature, top_k (0 -> -1, disabled), top_p,
    min_p, repetition_penalty, max_new_tokens (-> max_tokens). EOS falls back to
    config.json's ``eos_token_id``. An unreadable file or a value SamplingParams refuses
    raises ValueError naming the file.
    """
    file = Path(path) / "generation_config.json"
    ids = None
    sampling: dict[str, Any] = {}
    if file.is_file():
        from transformers import GenerationConfig

        # read first: a bad file or EOS value is named here, not deep inside transformers
        ids = eos_ids(read_json(file, "the generation defaults (a JSON object)").get("eos_token_id"), str(file))
        from transformers.utils import logging as hf_logging

        # transformers warns that sampling values "may be ignored" when do_sample is off; the
        # engine applies them itself, so the warning would only mislead
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            gen = GenerationConfig.from_pretrained(str(file.parent))
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"{file}: not a valid generation config: {e}") from e
        finally:
            hf_logging.set_verbosity(level)
        if mode == "auto":
            diff = gen.to_diff_dict()
            sampling = {dst: diff[src] for src, dst in _SAMPLING_KEYS.items() if diff.get(src) is not None}
            if sampling.get("top_k") == 0:
                sampling["top_k"] = -1
            try:
                SamplingParams(**sampling)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{file}: its sampling defaults are invalid: {e}") from e
            if sampling:
                logger.info("sampling defaults from %s: %s (generation_config='vllm' ignores them)", file, sampling)
    if ids is None:
        ids = eos_ids(getattr(hf_config, "eos_token_id", None), str(Path(path) / "config.json"))
    return GenerationDefaults(eos_token_ids=ids or (), sampling=sampling)


# ---- memory ----------------------------------------------------------------------------
MemoryProbe = Callable[[torch.device], "int | tuple[int, int]"]


def read_memory(probe: MemoryProbe, device: torch.device) -> tuple[int, int]:
    """(free, total) bytes from a probe; a probe returning one int gives free bytes, and
    the device is then taken as otherwise idle (total = free)."""
    got = probe(device)
    if isinstance(got, tuple):
        free, total = got
        return int(free), int(total)
    return int(got), int(got)


def kv_cache_budget(config: EngineConfig, free: int, total: int, activation_bytes: int = 0) -> int:
    """Bytes the KV pool (with its per-row state) may take.

    ``gpu_memory_utilization`` u: the engine may use u x total; what is in use already
    (total - free: weights, and anything else on the device) and the activation peak of a
    full-budget step come off it. ``kv_cache_memory_fraction`` f (the CPU): f x free.
    A budget of zero or less raises ValueError naming the field and the figures.
    """
    gib = 2**30
    if config.gpu_memory_utilization is not None:
        u = config.gpu_memory_utilization
        budget = int(total * u) - (total - free) - activation_bytes
        if budget <= 0:
            raise ValueError(
                f"gpu_memory_utilization={u} leaves no memory for the KV cache: {u} x {total / gib:.2f} GiB total "
                f"= {total * u / gib:.2f} GiB, of which {(total - free) / gib:.2f} GiB is in use (weights, other "
                f"processes) and {activation_bytes / gib:.2f} GiB is the activation peak; raise "
                f"gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs"
            )
        return budget
    return int(free * config.kv_cache_memory_fraction)


# The default max_num_seqs of a model with per-row recurrent state is lowered until the
# rows' state (with its prefix-cache snapshots) and a full-length KV for every row fit this
# share of the cache memory; the rest is left to the activations and the KV pool's slack.
# Mamba2-780m's state of 1,024 rows (~75 GB) cannot fit an 80 GB GPU at all, while
# granite-4.0-h-350m's 1,024 rows (~43 GiB with snapshots) leave its 4 attention layers room.
ROW_FIT_SHARE = 0.8


def fit_max_num_seqs(config: EngineConfig, state_bytes_per_row: int, snapshot_bytes_per_row: int,
                     kv_bytes_per_token: int, snapshots: bool, weight_bytes: int, free: int, total: int) -> int:
    """The max_num_seqs to use: the config's, or, when the engine chose it (the user left it
    None) and the model keeps per-row state, the largest power-of-two fraction of it whose
    rows (+1 scratch row), snapshot slots (one per row when ``snapshots`` and
    ``mamba_cache_slots`` is None) and ``max_model_len`` tokens of KV per row fit
    ``ROW_FIT_SHARE`` of the cache memory: what ``kv_cache_budget`` gives before the weights
    (``weight_bytes``, not loaded yet) are in use. Never below 1: a single row that does not
    fit is refused later, by name."""
    seqs = config.max_num_seqs
    if not getattr(config, "_chosen_limits", (False, False))[0] or state_bytes_per_row <= 0:
        return seqs
    try:  # the weights will be in use: as if they were gone from the free memory already
        budget = kv_cache_budget(config, free - weight_bytes, total)
    except ValueError:  # nothing left at all: one row, which the engine's own sizing then refuses by name
        budget = 0

    def need(n: int) -> int:
        slots = (config.mamba_cache_slots or n) if snapshots else 0
        kv = n * config.max_model_len * kv_bytes_per_token
        return state_bytes_per_row * (n + 1) + snapshot_bytes_per_row * slots + kv

    while seqs > 1 and need(seqs) > ROW_FIT_SHARE * budget:
        seqs //= 2
    return seqs


# vLLM's token budget for pooling runners (POOLING_MODEL_MAX_NUM_BATCHED_TOKENS)
POOLING_MAX_NUM_BATCHED_TOKENS = 32768


def pooling_batch_tokens(config: EngineConfig, tasks: tuple[str, ...]) -> int:
    """The max_num_batched_tokens to use: the config's, or, when the engine chose it and the
    model only pools (no "generate" task) on a GPU, at least 32,768 as vLLM gives pooling
    runners (capped at what max_num_seqs full-length prompts could use). A pooling step has
    no decode rows to keep short, so a larger step only batches more prompts: the
    cross-encoder bench (benchmarks/rerank_bench.py, H100) scored 2,154-2,641 pairs/s at
    8,192 tokens a step and 4,035-4,265 at 32,768. On the CPU the default stays: its steps
    are bound by compute, not by launches."""
    tokens = config.max_num_batched_tokens
    chosen = getattr(config, "_chosen_limits", (False, False))[1]
    if not chosen or "generate" in tasks or not config.device.startswith("cuda"):
        return tokens
    return max(tokens, min(POOLING_MAX_NUM_BATCHED_TOKENS, config.max_num_seqs * config.max_model_len))


# ---- CPU threads -------------------------------------------------------------------------
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# torch's intra-op count is process-wide: remembering the count the engine set lets a later
# engine tell its own earlier choice from a user's torch.set_num_threads, and log only changes
_chosen: dict[str, Any] = {}


@dataclass(frozen=True)
class CpuCounts:
    """CPUs this process may use: ``logical`` (its affinity mask), ``physical`` (distinct
    cores among them: SMT siblings share one core's arithmetic units) and ``quota`` (the
    cgroup's CPU limit rounded up; None when unlimited)."""

    logical: int
    physical: int
    quota: int | None = None


def read_cpu_counts() -> CpuCounts:
    """This process's ``CpuCounts``, from its affinity mask, sysfs topology and the cgroup
    (v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``); a part that cannot be read is left out."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))
    return CpuCounts(logical=len(cpus), physical=len(cores) or len(cpus), quota=_cgroup_cpu_quota())


def _cgroup_cpu_quota() -> int | None:
    """The cgroup's CPU limit in whole CPUs, rounded up: v2 ``cpu.max`` ("quota period"), else
    v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; None when unlimited or unreadable."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        v1 = Path("/sys/fs/cgroup/cpu")
        try:
            quota, period = (v1 / "cpu.cfs_quota_us").read_text(), (v1 / "cpu.cfs_period_us").read_text()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:  # v2 writes "max" for no limit
        return None
    return math.ceil(q / p) if q > 0 and p > 0 else None


def choose_cpu_threads(device: str, ranks_on_node: int = 1, counts: CpuCounts | None = None) -> int | None:
    """Set this process's intra-op thread count for the CPU path unless the user chose one;
    returns the count each of the node's ``ranks_on_node`` ranks runs with (None on CUDA,
    where the host's threads are left as torch set them).

    The user's choice is ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (torch reads them) or a
    ``torch.set_num_threads(n)`` before the engine is built, seen as a count that is neither
    torch's start-up default (the usable physical or logical CPUs) nor one this function set.
    Otherwise: one thread less than the usable cores (physical cores of the affinity mask,
    capped by the cgroup quota), shared between the node's ranks, at least one. torch's
    default fills every core, and OpenMP's workers wait for each other at the end of every op:
    when anything else runs on one of the cores (the engine's own tokenizer or server
    threads, other processes) every small op waits for a preempted worker. On 2 shared cores
    64 prompts x 8 tokens of the demo model took 2.1-9.8 s with 2 threads, 0.25-0.35 s with 1.
    vLLM's CPU backend likewise leaves a core to the rest of the engine."""
    if not device.startswith("cpu"):
        return None
    counts = counts or read_cpu_counts()
    current = torch.get_num_threads()
    given = [f"{name}={os.environ[name]}" for name in THREAD_ENV_VARS if os.environ.get(name)]
    if given:
        chosen, why = current, f"{', '.join(given)} is set"
    elif current not in (counts.logical, counts.physical) and current != _chosen.get("threads"):
        chosen, why = current, "torch.set_num_threads was called before the engine was built"
    else:
        usable = min(counts.physical, counts.quota or counts.physical)
        chosen = max(1, (usable - 1) // max(1, ranks_on_node))
        shared = f", shared by {ranks_on_node} ranks" if ranks_on_node > 1 else ""
        why = (f"one less than the {usable} usable cores{shared}, so that other threads and processes do not "
               f"stall the OpenMP workers; OMP_NUM_THREADS or torch.set_num_threads overrides")
        if chosen != current:
            torch.set_num_threads(chosen)
        _chosen["threads"] = chosen
    if _chosen.get("logged") != (chosen, why):
        _chosen["logged"] = (chosen, why)
        logger.info("CPU intra-op threads: %d (%s)", chosen, why)
    return chosen
