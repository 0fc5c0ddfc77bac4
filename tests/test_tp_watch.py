"""The NCCL watcher (``executor.multiproc._watch``) without NCCL: NCCL collectives do not fail
when a peer dies, so rank 0 aborts its group when a worker process exits, unless the exit is
expected (shutdown). The NCCL abort itself runs only on GPUs (issue 28)."""
from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

from core_runner.executor import multiproc


class _Group:
    def __init__(self) -> None:
        self.aborted = threading.Event()

    def abort(self) -> None:
        self.aborted.set()


def _exit_with(code: int) -> None:
    raise SystemExit(code)


def _workers(code: int, closing: bool = False) -> multiproc._Workers:
    ctx = mp.get_context("fork")
    w = multiproc._Workers()
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_exit_with, args=(code,), daemon=True)
    w.procs[1], w.pipes[1] = p, recv
    w.closing = closing
    p.start()
    send.close()
    return w


@pytest.fixture
def group_abort(monkeypatch):
    """Rank 0's abort goes to the group object (torch builds without _abort_process_group)."""
    monkeypatch.setattr(multiproc.dist.distributed_c10d, "_abort_process_group", None, raising=False)


def test_a_dying_worker_aborts_the_group_and_is_named(group_abort, caplog):
    group = _Group()
    workers = _workers(3)
    t = threading.Thread(target=multiproc._watch, args=(workers, group), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive() and group.aborted.is_set()
    assert "worker rank 1" in caplog.text and "exited with code 3" in caplog.text


def test_an_expected_exit_aborts_nothing(group_abort):
    group = _Group()
    workers = _workers(0, closing=True)
    t = threading.Thread(target=multiproc._watch, args=(workers, group), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive() and not group.aborted.is_set()


def test_a_failing_abort_is_logged_not_raised(monkeypatch, caplog):
    def broken(group):
        raise RuntimeError("abort failed")

    monkeypatch.setattr(multiproc.dist.distributed_c10d, "_abort_process_group", broken, raising=False)
    workers = _workers(1)
    multiproc._watch(workers, _Group())  # returns: the thread must not die with an exception
    assert "could not abort the NCCL group" in caplog.text
