"""Rank 0 of a tensor-parallel engine: starts the workers, forwards each call to them,
runs its own part, and turns any rank's failure into ``EngineDeadError``.

The driver process is rank 0 (as in nano-vllm): the scheduler, its runner and the
engine's inspection API (``engine.debug``: logits, rows, caches) stay in one process
and read rank 0's state; only ranks 1..N-1 are started (torch.multiprocessing,
"forkserver": see ``_context``). Each call is broadcast to the workers first (``ControlChannel``), then run
locally, so all ranks enter the same collectives in the same order.

Failure: a worker that raises writes its traceback to its error pipe and exits; rank
0 sees its exit when a collective fails (gloo: at once; NCCL: a watcher thread aborts
the group when a worker exits, see ``_watch``) or when it checks the workers before the
next call, and raises ``EngineDeadError`` naming the rank, its exit code
and error. A failure on rank 0 is fatal as well: the workers may be waiting in a
collective that rank 0 will never enter, so they are stopped.

Nodes: with ``nnodes > 1`` node 0 holds ranks 0..k-1 (k = tensor_parallel_size /
nnodes) and node n ranks n*k..(n+1)*k-1, started there by ``run_headless_node``; every
rank receives its spec from rank 0, so the other nodes need only the rendezvous
address (``master_addr:master_port``, torch's TCP store, as env:// reads it from
MASTER_ADDR / MASTER_PORT) and the model files at the same path.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import types
import weakref
from typing import Any, Iterator

import torch.distributed as dist
import torch.multiprocessing as mp

from core_runner.distributed import GroupCoordinator, destroy_tensor_parallel, init_tensor_parallel, set_tp_group
from core_runner.executor.control import ControlChannel
from core_runner.executor.errors import EngineDeadError
from core_runner.executor.worker import SHUTDOWN, worker_main

logger = logging.getLogger(__name__)

# how long rank 0 waits for a dead worker's exit code and error text before reporting
_REPORT_WAIT_S = 5.0


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class _Workers:
    """The worker processes of one node and their error pipes (what the finalizer needs)."""

    def __init__(self) -> None:
        self.procs: dict[int, Any] = {}  # global rank -> process
        self.pipes: dict[int, Any] = {}
        self.errors: dict[int, str] = {}
        self.closing = False  # set by shutdown: exits from then on are expected

    def start(self, ranks: list[tuple[int, int]], world_size: int, init_method: str, backend: str,
              preload: list[str] = (), threads: int | None = None) -> None:
        """``threads``: each worker's intra-op count (the driver's choice); None shares the
        node's CPUs between these ranks and one more."""
        ctx = _context(list(preload))
        threads = threads or max(1, (os.cpu_count() or 1) // max(1, len(ranks) + 1))
        for rank, local_rank in ranks:
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=worker_main, name=f"core-runner-tp-rank{rank}", daemon=True,
                            args=(rank, local_rank, world_size, init_method, backend, send, threads, list(sys.path)))
            with _main_module_hidden():
                p.start()
            send.close()
            self.procs[rank], self.pipes[rank] = p, recv

    def dead(self) -> list[int]:
        return [r for r, p in self.procs.items() if p.exitcode is not None]

    def describe(self, wait_s: float = 0.0) -> str:
        """Which workers died, how, and their error text (waits up to ``wait_s`` for one
        to exit: after a failed collective its exit may lag by a moment)."""
        deadline = time.monotonic() + wait_s
        while not self.dead() and time.monotonic() < deadline:
            time.sleep(0.05)
        parts = []
        for rank in self.dead():
            pipe = self.pipes[rank]
            try:
                if rank not in self.errors and pipe.poll(max(0.0, deadline - time.monotonic())):
                    self.errors[rank] = pipe.recv()
            except (EOFError, OSError):
                pass
            code = self.procs[rank].exitcode
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            err = self.errors.get(rank)
            parts.append(f"tensor-parallel worker rank {rank} (pid {self.procs[rank].pid}) {how}"
                         + (f": {err.strip().splitlines()[0]}" if err else ""))
        return "; ".join(parts)

    def stop(self, timeout_s: float = 5.0) -> None:
        for p in self.procs.values():
            p.join(timeout=timeout_s)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(timeout=timeout_s)


def torch_backend(group: GroupCoordinator) -> str:
    return str(dist.get_backend(group.device_group)).lower()


def _context(preload: list[str]) -> Any:
    """Workers fork from a forkserver that has imported torch, transformers' config code and
    the engine once (those imports are most of a worker's start: ~3-6 s on a busy 2-core
    machine, against ~0.1 s for a fork), so every engine after the first starts its ranks
    at once. The server itself is a fresh process (no CUDA, no threads of the driver), as
    safe as "spawn". ``preload`` counts only when the server starts; it leaves out
    ``"__main__"`` (the stdlib's default), so the server never runs the driver's script."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "transformers.configuration_utils", "core_runner.executor.worker",
                                "core_runner.executor.build", *preload])
    return ctx


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """``__main__`` is a blank module while a worker starts. A forkserver (or spawn) child
    re-runs the parent's main script, named by ``__main__.__file__`` / ``__spec__`` in the
    data ``Process.start`` sends, before it unpickles its target: a script without an
    ``if __name__ == "__main__":`` guard would build its engine again in every worker,
    which multiprocessing refuses ("before the current process has finished its
    bootstrapping phase"). The workers need nothing from the script: their target and
    arguments live in core_runner, and anything of the script's fails to pickle here, by
    name. (runpy swaps ``sys.modules["__main__"]`` the same way while it runs a module.)"""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _finalize(workers: _Workers) -> None:
    workers.closing = True
    workers.stop(timeout_s=2.0)
    destroy_tensor_parallel()


def _watch(workers: _Workers, device_group: Any) -> None:
    """NCCL collectives do not fail when a peer dies (gloo's do, at once): they wait for the
    process group's timeout. This thread waits on the workers' exits and aborts rank 0's
    NCCL group when one dies, so that a collective blocked on it returns with an error."""
    from multiprocessing.connection import wait

    wait([p.sentinel for p in workers.procs.values()])
    if workers.closing:
        return
    logger.error("a tensor-parallel worker died: %s; aborting the NCCL group", workers.describe(wait_s=1.0))
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    try:
        abort(device_group) if abort is not None else device_group.abort()
    except Exception:
        logger.exception("could not abort the NCCL group; a pending collective waits for its timeout")


class MultiprocRunner:
    """Rank 0's ``ModelRunner`` (``.runner``) plus the other ranks; the engine calls it as
    it calls a runner (``execute_model``, ``reset_rows``, ``initialize_kv_cache``, ``release_kv_caches``,
    ``capture_graphs``) and reads rank 0's state through ``.runner``."""

    def __init__(self, group: GroupCoordinator, channel: ControlChannel, workers: _Workers) -> None:
        self.group, self.channel, self.workers = group, channel, workers
        self.runner: Any = None
        self.dead: str | None = None
        self._finalizer = weakref.finalize(self, _finalize, workers)
        if workers.procs and torch_backend(group) == "nccl":
            threading.Thread(target=_watch, args=(workers, group.device_group), name="core-runner-tp-watch",
                             daemon=True).start()

    @classmethod
    def start(cls, world_size: int, nnodes: int, master_addr: str, master_port: int | None, device: str,
              expert_parallel: bool, timeout_s: float, preload: list[str] = (),
              threads: int | None = None) -> "MultiprocRunner":
        """Start node 0's workers and join the group as rank 0 (``preload``: modules the
        workers will import, e.g. the model config's, imported once by the forkserver;
        ``threads``: each worker's intra-op thread count, None for a share of the node)."""
        per_node = world_size // nnodes
        port = master_port or free_port(master_addr)
        init_method = f"tcp://{master_addr}:{port}"
        backend = "nccl" if device.startswith("cuda") else "gloo"
        workers = _Workers()
        workers.start([(r, r) for r in range(1, per_node)], world_size, init_method, backend, preload, threads)
        group = _join(workers, world_size, init_method, backend, timeout_s)
        group.expert_parallel = expert_parallel
        set_tp_group(GroupCoordinator())  # the group is entered by the runner only, not process-wide
        return cls(group, ControlChannel(group.cpu_group, 0), workers)

    @property
    def req_state(self) -> Any:
        return self.runner.req_state

    def broadcast_spec(self, spec: Any) -> None:
        self._guard(lambda: self.channel.send(spec), "sending the model spec")

    def _guard(self, fn, what: str) -> Any:
        if self.dead is not None:
            raise EngineDeadError(f"the engine is stopped: {self.dead}")
        lost = self.workers.dead()
        if lost:
            self._die(f"before {what}: {self.workers.describe()}")
        try:
            return fn()
        except BaseException as exc:
            died = self.workers.describe(wait_s=_REPORT_WAIT_S)
            cause = died or f"rank 0 failed {what}: {type(exc).__name__}: {exc}"
            self._die(cause, exc)

    def _die(self, cause: str, exc: BaseException | None = None) -> None:
        self.dead = cause
        logger.error("tensor-parallel engine stopped: %s", cause)
        for p in self.workers.procs.values():
            if p.is_alive():
                p.kill()
        raise EngineDeadError(f"{cause}; under tensor parallelism a failed rank stops the engine (the ranks' "
                              "collectives can no longer be matched): build a new engine") from exc

    def _call(self, name: str, *args: Any) -> Any:
        def run() -> Any:
            self.channel.send((name, args))
            return getattr(self.runner, name)(*args)

        return self._guard(run, name)

    def execute_model(self, out: Any, dummy: bool = False) -> Any:
        return self._call("execute_model", out, dummy)

    def initialize_kv_cache(self, num_blocks: int, num_rows: int | None = None) -> None:
        self._call("initialize_kv_cache", num_blocks, num_rows)

    def release_kv_caches(self) -> None:
        self._call("release_kv_caches")

    def capture_graphs(self) -> int:
        return self._call("capture_graphs")

    def reset_rows(self, req_ids: list[str]) -> None:
        if self.dead is not None:  # after a fatal fault only rank 0's own rows are cleaned up
            return self.runner.reset_rows(req_ids)
        self._call("reset_rows", req_ids)

    def shutdown(self) -> None:
        """Stop the workers and leave the group (also run when the runner is collected or the
        process exits); a new tensor-parallel engine can then be built in this process."""
        if self.dead is None:
            try:
                self.channel.send((SHUTDOWN, ()))
            except Exception:
                logger.warning("a worker did not take the shutdown message; stopping it")
            self.dead = "the engine was shut down"
        self._finalizer()


def _join(workers: _Workers, world_size: int, init_method: str, backend: str, timeout_s: float) -> GroupCoordinator:
    """Join the group as rank 0 while watching the local workers: a worker that dies before
    it joins would otherwise leave rank 0 waiting for the whole rendezvous timeout."""
    result: dict[str, Any] = {}

    def join() -> None:
        try:
            result["group"] = init_tensor_parallel(world_size, 0, 0, backend, init_method, timeout_s=timeout_s)
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=join, name="core-runner-tp-rendezvous", daemon=True)
    t.start()
    while t.is_alive():
        t.join(timeout=0.1)
        if workers.dead():
            why = workers.describe(wait_s=_REPORT_WAIT_S)
            workers.stop(timeout_s=1.0)
            raise EngineDeadError(f"a worker died before joining the tensor-parallel group: {why}")
    if "error" in result:
        workers.stop(timeout_s=1.0)
        raise EngineDeadError(f"rank 0 could not join the tensor-parallel group at {init_method}: "
                              f"{result['error']}") from result["error"]
    return result["group"]


def run_headless_node(world_size: int, nnodes: int, node_rank: int, master_addr: str, master_port: int,
                      device: str) -> int:
    """Start node ``node_rank``'s ranks (no engine here: rank 0's node drives them) and wait
    for them; returns the first non-zero exit code, or 0."""
    per_node = world_size // nnodes
    workers = _Workers()
    backend = "nccl" if device.startswith("cuda") else "gloo"
    first = node_rank * per_node
    workers.start([(first + i, i) for i in range(per_node)], world_size, f"tcp://{master_addr}:{master_port}",
                  backend)
    codes = []
    for p in workers.procs.values():
        p.join()
        codes.append(p.exitcode or 0)
        if p.exitcode:
            logger.error("%s", workers.describe())
    return next((c for c in codes if c), 0)
