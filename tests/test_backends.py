"""Kernel mode and attention backend are two choices (issue 21): ``EngineConfig.kernels``
picks the layers' implementation, ``attention_backend`` a registered backend by name;
the plan names both, and CUDA graphs need Triton kernels and a graph-capable backend."""
from __future__ import annotations

import sys

import pytest
from helpers import greedy, make_engine, random_prompts, run

from core_runner.attention.registry import backend_names, get_backend, register_backend, unregister_backend
from core_runner.attention.torch_backend import TorchPagedAttention
from core_runner.config import EngineConfig
from core_runner.oracle import UnsupportedError, plan_execution
from core_runner.registry import Registry


def _reg(**caps):
    r = Registry()
    full = dict.fromkeys(("chunked_prefill", "triton_attention", "cuda_graphs", "async_scheduling"), "supported")
    r.add("A", "m:M", "s:S", capabilities={**full, **caps})
    return r.get("A")


class Counting(TorchPagedAttention):
    """A third backend: the torch reference, counting its calls."""

    name = "counting"
    calls = 0

    def forward(self, q, kv_cache, md, scale):
        type(self).calls += 1
        return super().forward(q, kv_cache, md, scale)


@pytest.fixture
def counting():
    register_backend("counting", Counting)
    Counting.calls = 0
    yield Counting
    unregister_backend("counting")


def test_plan_names_kernels_and_backend():
    cpu = plan_execution(EngineConfig(model="x"), _reg())
    assert (cpu.kernels, cpu.attention_backend, cpu.cuda_graphs) == ("torch", "torch", False)
    cuda = plan_execution(EngineConfig(model="x", device="cuda"), _reg())
    assert (cuda.kernels, cuda.attention_backend, cuda.cuda_graphs) == ("triton", "triton", True)
    assert not hasattr(cuda, "sampler")


def test_kernels_torch_on_cuda_turns_graphs_off_with_a_named_reason():
    plan = plan_execution(EngineConfig(model="x", device="cuda", kernels="torch", strict=False), _reg())
    assert (plan.kernels, plan.attention_backend, plan.cuda_graphs) == ("torch", "torch", False)
    assert "CUDA graphs off: they need the Triton kernels, which are off" in plan.downgrades
    # Triton attention with the torch layers is a valid plan; graphs still need the Triton kernels
    mixed = plan_execution(EngineConfig(model="x", device="cuda", kernels="torch", attention_backend="triton",
                                        strict=False), _reg())
    assert (mixed.kernels, mixed.attention_backend, mixed.cuda_graphs) == ("torch", "triton", False)
    with pytest.raises(UnsupportedError, match="strict mode: CUDA graphs off"):
        plan_execution(EngineConfig(model="x", device="cuda", kernels="torch", strict=True), _reg())


def test_graphs_need_a_graph_capable_backend():
    plan = plan_execution(EngineConfig(model="x", device="cuda", attention_backend="torch", strict=False), _reg())
    assert (plan.kernels, plan.attention_backend, plan.cuda_graphs) == ("triton", "torch", False)
    assert "CUDA graphs off: attention backend 'torch' declares supports_cuda_graphs=False" in plan.downgrades


def test_kernels_option_is_validated(monkeypatch):
    with pytest.raises(ValueError, match=r"kernels='cuda' is invalid: expected None \(auto\), 'torch' or 'triton'"):
        EngineConfig(model="x", kernels="cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UnsupportedError, match="kernels='triton' on the CPU needs .*TRITON_INTERPRET=1"):
        plan_execution(EngineConfig(model="x", kernels="triton"), _reg())


def test_unknown_backend_lists_the_registered_names():
    with pytest.raises(UnsupportedError, match=r"attention_backend='flash' is invalid: registered backends are "
                                               r"'torch', 'triton'"):
        plan_execution(EngineConfig(model="x", attention_backend="flash"), _reg())
    with pytest.raises(ValueError, match="attention_backend=3 is invalid"):
        EngineConfig(model="x", attention_backend=3)
    with pytest.raises(ValueError, match=r"attention backend 'flash' is unknown: registered backends are "
                                         r"'torch', 'triton'"):
        get_backend("flash")
    with pytest.raises(ValueError, match="already registered"):
        register_backend("torch", TorchPagedAttention)


def test_registry_imports_no_triton():
    import subprocess

    code = ("import sys; import core_runner.attention.registry as r; "
            "assert r.backend_names() == ['torch', 'triton']; r.get_backend('torch'); "
            "assert 'triton' not in sys.modules, [m for m in sys.modules if 'triton' in m]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_registered_backend_is_selectable_by_name(untied, counting):
    assert "counting" in backend_names()
    plan = plan_execution(EngineConfig(model="x", attention_backend="counting"), _reg())
    assert plan.attention_backend == "counting" and plan.kernels == "torch"
    cuda = plan_execution(EngineConfig(model="x", device="cuda", attention_backend="counting", strict=False), _reg())
    assert not cuda.cuda_graphs and "supports_cuda_graphs=False" in " ".join(cuda.downgrades)
    prompts = random_prompts([5, 9], seed=4)
    want = run(make_engine(untied, max_model_len=32, max_num_seqs=2),
               [(f"r{i}", p, greedy(3)) for i, p in enumerate(prompts)])
    e = make_engine(untied, max_model_len=32, max_num_seqs=2, attention_backend="counting")
    assert isinstance(e.runner.backend, Counting) and e.plan.attention_backend == "counting"
    got = run(e, [(f"r{i}", p, greedy(3)) for i, p in enumerate(prompts)])
    assert Counting.calls > 0
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in want.items()}
