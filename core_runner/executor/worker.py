"""A tensor-parallel worker process: one rank other than the driver's rank 0.

It joins the process group, receives its ``RankSpec`` from rank 0 over the control
channel, builds its part of the model and runner, then executes every call rank 0
broadcasts (steps, KV cache setup, graph capture, row resets) in the same order, which
keeps the ranks' collectives matched. Any error ends the process (after writing the
traceback to rank 0's error pipe, when it has one): a rank that failed a step cannot
rejoin the others' collectives, and its exit is what rank 0 detects.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import replace
from typing import Any

logger = logging.getLogger(__name__)

SHUTDOWN = "shutdown"
# the calls a worker accepts from rank 0 (names of ModelRunner methods)
CALLS = ("execute_model", "reset_rows", "initialize_kv_cache", "release_kv_caches", "capture_graphs")


def rank_device(device: str, local_rank: int) -> str:
    """The device of a node's local rank: its own GPU (cuda:local_rank), or the CPU."""
    return f"cuda:{local_rank}" if device.startswith("cuda") else device


def worker_main(
    rank: int, local_rank: int, world_size: int, init_method: str, backend: str, error_pipe: Any,
    num_threads: int, sys_path: list[str],
) -> None:
    sys.path[:] = sys_path
    try:
        import torch

        from core_runner.distributed import init_tensor_parallel
        from core_runner.executor.build import build_runner
        from core_runner.executor.control import ControlChannel
        from core_runner.executor.gc_heap import freeze_gc_heap
        from core_runner.plugins import load_plugins

        torch.set_num_threads(max(1, num_threads))
        group = init_tensor_parallel(world_size, rank, local_rank, backend, init_method)
        channel = ControlChannel(group.cpu_group, rank)
        spec = channel.recv()
        spec.config = replace(spec.config, device=rank_device(spec.config.device, local_rank))
        group.expert_parallel = spec.config.enable_expert_parallel
        if spec.config.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(spec.config.device))
        load_plugins(strict=False)  # plugins may register attention backends the plan names
        runner = build_runner(spec)
        while True:
            call, args = channel.recv()
            if call == SHUTDOWN:
                break
            if call not in CALLS:
                raise RuntimeError(f"rank {rank}: unknown call {call!r} from rank 0")
            getattr(runner, call)(*args)
            if call == "capture_graphs":  # the last start-up call: this process keeps its heap for good
                freeze_gc_heap()
    except BaseException as exc:
        text = f"rank {rank} (pid {os.getpid()}): {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        if error_pipe is not None:
            try:
                error_pipe.send(text)
            except Exception:
                pass
        print(text, file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)
