"""The engine's CPU intra-op thread count (``engine.defaults.choose_cpu_threads``): chosen
from the usable cores when the user chose nothing, the user's OMP_NUM_THREADS /
MKL_NUM_THREADS / torch.set_num_threads kept, logged once."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from core_runner import LLM
from core_runner.engine import defaults
from core_runner.engine.defaults import CpuCounts, choose_cpu_threads, read_cpu_counts

LOGGER = "core_runner.engine.defaults"


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch):
    """Each test starts with no thread variables and no earlier choice, and leaves torch's
    count as it found it (the count is process-wide)."""
    for name in defaults.THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(defaults, "_chosen", {})
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def thread_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and "intra-op threads" in r.getMessage()]


def test_default_count_leaves_one_core_free_and_is_logged_once(caplog):
    torch.set_num_threads(4)  # what torch starts with on 4 cores
    counts = CpuCounts(logical=8, physical=4)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_cpu_threads("cpu", counts=counts) == 3
        assert torch.get_num_threads() == 3
        assert choose_cpu_threads("cpu", counts=counts) == 3  # its own earlier choice, not the user's
    lines = thread_lines(caplog)
    assert len(lines) == 1 and "3 (one less than the 4 usable cores" in lines[0], lines


@pytest.mark.parametrize("counts, ranks, want", [
    (CpuCounts(logical=2, physical=2), 1, 1),  # the measured case: 2 shared cores
    (CpuCounts(logical=1, physical=1), 1, 1),
    (CpuCounts(logical=16, physical=16), 2, 7),  # two ranks on the node share 15 cores
    (CpuCounts(logical=64, physical=32, quota=4), 1, 3),  # a container's CPU quota caps the cores
])
def test_count_from_cores_ranks_and_quota(counts, ranks, want):
    torch.set_num_threads(counts.physical)
    assert choose_cpu_threads("cpu", ranks, counts=counts) == want
    assert torch.get_num_threads() == want


@pytest.mark.parametrize("name", defaults.THREAD_ENV_VARS)
def test_thread_variables_are_the_users_choice(name, monkeypatch, caplog):
    monkeypatch.setenv(name, "2")
    torch.set_num_threads(2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_cpu_threads("cpu", counts=CpuCounts(logical=8, physical=8)) == 2
    assert torch.get_num_threads() == 2
    assert f"2 ({name}=2 is set)" in thread_lines(caplog)[0]


def test_set_num_threads_before_the_engine_is_kept(caplog):
    torch.set_num_threads(3)  # neither 8 nor 4: not torch's default on this (described) machine
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_cpu_threads("cpu", counts=CpuCounts(logical=8, physical=4)) == 3
    assert torch.get_num_threads() == 3
    assert "torch.set_num_threads was called" in thread_lines(caplog)[0]


def test_cuda_leaves_the_host_threads_alone():
    torch.set_num_threads(2)
    assert choose_cpu_threads("cuda:0", counts=CpuCounts(logical=2, physical=2)) is None
    assert torch.get_num_threads() == 2


def test_this_machines_counts():
    counts = read_cpu_counts()
    assert counts.logical == len(os.sched_getaffinity(0))
    assert 1 <= counts.physical <= counts.logical
    assert counts.quota is None or counts.quota >= 1


def test_cpu_engine_applies_the_choice(untied, caplog):
    counts = read_cpu_counts()
    torch.set_num_threads(counts.physical)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        llm = LLM(untied.path, device="cpu", max_model_len=64, max_num_seqs=2, num_kv_blocks=16, block_size=8)
    want = max(1, min(counts.physical, counts.quota or counts.physical) - 1)
    assert llm.engine.cpu_threads == want == torch.get_num_threads()
    assert thread_lines(caplog)
