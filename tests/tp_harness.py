"""Run a function on N gloo ranks (spawned processes on the CPU) and collect the results.

``run_ranks(fn, world_size, *args)`` -> [result of rank 0, ..., rank N-1]. ``fn`` must be a
module-level function (it is pickled for ``spawn``); it runs after the rank has joined
the group and installed it as the tensor-parallel group, so layers built inside see
``get_tensor_model_parallel_world_size() == world_size``. A rank that raises makes
``run_ranks`` raise with that rank's traceback. Results travel through a queue as plain
pickled bytes (a tensor put on a multiprocessing queue as is would travel as a
shared-memory handle that dies with the rank's process): return CPU tensors or plain data.
"""
from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, fn, args, queue, expert_parallel, sys_path) -> None:
    sys.path[:] = sys_path
    import torch

    from core_runner.distributed import destroy_tensor_parallel, init_tensor_parallel

    torch.set_num_threads(1)
    try:
        init_tensor_parallel(world_size, rank, rank, "gloo", f"tcp://127.0.0.1:{port}",
                             expert_parallel=expert_parallel, timeout_s=60)
        queue.put((rank, True, pickle.dumps(fn(*args))))
    except BaseException:
        queue.put((rank, False, traceback.format_exc()))
    finally:
        destroy_tensor_parallel()


def run_ranks(fn, world_size: int, *args, expert_parallel: bool = False, timeout_s: float = 120.0) -> list:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world_size, port, fn, args, queue, expert_parallel,
                                                  list(sys.path)), daemon=True) for r in range(world_size)]
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        for p in procs:
            p.start()
    finally:
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_threads
    results: dict[int, object] = {}
    errors: list[str] = []
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while len(results) + len(errors) < world_size:
            try:
                rank, ok, value = queue.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    errors.append(f"ranks {dead} exited with {[procs[r].exitcode for r in dead]} without a result"
                                  if dead else f"no result within {timeout_s} s")
                    break
                continue
            (results.__setitem__(rank, pickle.loads(value)) if ok else errors.append(f"rank {rank}:\n{value}"))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]
