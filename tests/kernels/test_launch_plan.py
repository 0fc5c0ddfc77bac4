"""Launch plans (``kernels/launch_plan.py``): a call's launches recorded through
``fast_launch`` once, then replayed with the new inputs' addresses. On stand-in kernels
(the CPU), and on the GPU through the split sampler, whose later calls replay the plan
kept on its workspace and still sample the reference's tokens."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels import fast_launch
from core_runner.kernels.fast_launch import FastLaunch
from core_runner.kernels.launch_plan import LaunchPlan, record
from test_fast_launch import _Fn


def test_a_plan_replays_the_recorded_launches_with_the_new_inputs():
    fn_a, fn_b = _Fn(), _Fn()
    a, b = FastLaunch(fn_a), FastLaunch(fn_b)
    a.enabled = b.enabled = True
    x, ws = torch.zeros(64), torch.zeros(32)
    with record() as steps:
        a[(3,)](x, 5, True, BLOCK=16, _key="k")  # compiles: through fn[grid]
        b[(4, 2)](ws, 7, False, BLOCK=8, _key="k")
        a[(5,)](ws, 9, True, BLOCK=16, _key="k")  # cached: straight to run
    assert fast_launch.RECORDER is None and len(steps) == 3
    plan = LaunchPlan(steps, (x,))
    y = torch.zeros(64)
    plan.replay([y.data_ptr()], 77)
    run_a1, run_a2 = fn_a.kernel.runs[-2:]
    (run_b,) = fn_b.kernel.runs
    assert run_a1[:4] == (3, 1, 1, 77) and run_a1[-5:] == (y.data_ptr(), 5, True, 16, False)  # the new input
    assert run_b[:4] == (4, 2, 1, 77) and run_b[-5:] == (ws.data_ptr(), 7, False, 8, False)  # scratch: its address
    assert run_a2[:4] == (5, 1, 1, 77) and run_a2[-5:] == (ws.data_ptr(), 9, True, 16, False)
    assert run_a1[6:9] == (None, None, None)  # no launch metadata or hooks


def test_a_launch_outside_fast_launch_leaves_no_plan():
    fn = _Fn()
    off = FastLaunch(fn)
    off.enabled = False  # through fn[grid] every time: not recordable
    with record() as steps:
        off[(1,)](torch.zeros(4), 5, True, BLOCK=16)
    assert steps[0][0] is None
    with pytest.raises(ValueError, match="did not go through fast_launch"):
        LaunchPlan(steps, ())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans replay compiled CUDA kernels (GPU only)")
def test_split_sampler_replays_its_plan():
    from core_runner.kernels import cut_sample_split_triton as cs
    from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
    from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
    from core_runner.sample.sampler import CUT_SHAPE, gumbel_sample_ref

    n, vocab, dev = 64, 151936, "cuda"
    inv = torch.full((n,), 1 / 0.7, device=dev)
    k, p = torch.full((n,), -1, dtype=torch.int32, device=dev), torch.full((n,), 0.9, device=dev)
    lmp = torch.full((n,), float("-inf"), device=dev)
    seeds, pos = torch.arange(n, device=dev), torch.full((n,), 3, device=dev)
    plans = []
    real = cs.LaunchPlan

    def keep(*a):
        plans.append(real(*a))
        return plans[-1]
    cs.LaunchPlan = keep
    try:
        for scale in (4.0, 3.0, 5.0):  # the first call records the plan, the others replay it
            logits = torch.randn(n, vocab, device=dev) * scale
            got = sample_with_cuts_triton(logits, inv, seeds, pos, k, p, lmp, **dict(CUT_SHAPE, all_top_p=True))
            want = gumbel_sample_ref(logits, inv, seeds, pos, top_k_top_p_threshold_ref(logits, inv, k, p, lmp))
            assert torch.equal(got, want), (got != want).sum()
    finally:
        cs.LaunchPlan = real
    from core_runner.kernels.split_workspace import _CACHE

    assert len(plans) <= 1  # (none when an earlier test recorded this key's plan)
    assert any(ws.plans for ws in _CACHE.values())


def test_launch_hooks_are_seen_set_only_when_one_is():
    """Plans replay without hooks, so they are used only while triton has none: its hook
    chains (triton 3.5+) exist, empty, when no hook is set."""
    from triton import knobs

    from core_runner.kernels.fast_launch import hooks_set

    assert not hooks_set()
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):  # (an older triton: a plain attribute)
        pytest.skip("this triton keeps launch hooks in a plain attribute")

    def hook(metadata):
        return None
    chain.add(hook)
    try:
        assert hooks_set()
    finally:
        chain.remove(hook)
    assert not hooks_set()
