"""Session fixtures: tiny random Qwen3 checkpoints saved with transformers.

Imports are lazy so that collecting other test directories (for example the kernel
tests, which set TRITON_INTERPRET in their own conftest) is not affected.
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def single_torch_thread():
    """The tiny models are far faster on one intra-op thread, and much less sensitive
    to other processes sharing the CPU (spinning OpenMP workers)."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, single_torch_thread):
    """{"untied": Checkpoint, "tied": Checkpoint}: float32 random Qwen3ForCausalLM
    checkpoints (fixed torch.manual_seed) and their HF model objects."""
    from helpers import build_checkpoints

    return build_checkpoints(tmp_path_factory.mktemp("qwen3_tiny"))


@pytest.fixture(scope="session")
def untied(checkpoints):
    return checkpoints["untied"]


@pytest.fixture(scope="session")
def tied(checkpoints):
    return checkpoints["tied"]


@pytest.fixture(scope="session", params=["untied", "tied"])
def ckpt(request, checkpoints):
    return checkpoints[request.param]


def pytest_collection_modifyitems(session, config, items):
    """The tests that wait for the background conformance runs go last, so the runs have the
    whole session on the second core before anything waits for them."""
    waits = [i for i in items if getattr(getattr(i, "module", None), "start_runs", None) is not None]
    if waits:
        items[:] = [i for i in items if i not in waits] + waits


def pytest_collection_finish(session):
    """Start the background conformance runs only when their tests were selected."""
    for item in session.items:
        start = getattr(getattr(item, "module", None), "start_runs", None)
        if start is not None:
            start()
            return
