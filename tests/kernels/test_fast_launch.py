"""The direct launch path (``kernels/fast_launch.py``) on a stand-in kernel: the first call
of a specialisation goes through ``fn[grid]``, later ones hand the full argument list (in
parameter order, defaults and constexprs in place) to the compiled kernel's ``run``; a
change triton would specialise on (alignment, an int becoming 1, a constexpr, a launch
option) goes through ``fn[grid]`` again. The real path runs on the GPU only."""
from __future__ import annotations

import torch

from core_runner.kernels.fast_launch import FastLaunch


class _Param:
    def __init__(self, constexpr: bool, default=None):
        self.is_constexpr = constexpr
        self.default = default


class _Kernel:
    function, packed_metadata = "fn", "meta"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.runs.append(args)


class _Fn:
    arg_names = ["x", "n", "flag", "BLOCK", "WIDE"]
    params = [_Param(False), _Param(False), _Param(False), _Param(True), _Param(True, False)]

    def __init__(self):
        self.kernel = _Kernel()
        self.jit_calls = []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return self.kernel
        return call


def test_fast_launch_reuses_the_compiled_kernel_per_specialisation():
    fn = _Fn()
    fl = FastLaunch(fn)
    fl.enabled = True
    x = torch.zeros(64)
    fl[(3,)](x, 5, True, BLOCK=16, num_warps=4)
    assert len(fn.jit_calls) == 1 and not fn.kernel.runs
    fl[(7, 2)](x, 21, True, BLOCK=16, num_warps=4)  # same specialisation: straight to run
    assert len(fn.jit_calls) == 1
    (run,) = fn.kernel.runs
    assert run[:3] == (7, 2, 1) and run[4:6] == ("fn", "meta")
    assert run[-5:] == (x, 21, True, 16, False)  # parameter order, the default of WIDE in place
    changes = [((x[1:], 5, True), dict(BLOCK=16, num_warps=4)),  # 4-byte aligned
               ((x, 1, True), dict(BLOCK=16, num_warps=4)),  # an int of 1
               ((x, 5, True), dict(BLOCK=32, num_warps=4)),  # another constexpr
               ((x, 5, True), dict(BLOCK=16, num_warps=8)),  # another launch option
               ((x.double(), 5, True), dict(BLOCK=16, num_warps=4))]  # another dtype
    for args, kw in changes:
        before = len(fn.jit_calls)
        fl[(1,)](*args, **kw)
        assert len(fn.jit_calls) == before + 1, (args, kw)
    fl.enabled = False
    fl[(1,)](x, 5, True, BLOCK=16, num_warps=4)  # off: always fn[grid]
    assert len(fn.jit_calls) == len(changes) + 2 and len(fn.kernel.runs) == 1


def test_fast_launch_takes_the_callers_key():
    """With ``_key`` the caller's key alone picks the compiled kernel (no per-argument
    work); the key is not passed on to the kernel."""
    fn = _Fn()
    fl = FastLaunch(fn)
    fl.enabled = True
    x = torch.zeros(64)
    fl[(2,)](x, 5, True, BLOCK=16, _key=("a", 1))
    assert fn.jit_calls == [((2,), (x, 5, True), dict(BLOCK=16))]
    fl[(3,)](x, 7, False, BLOCK=16, _key=("a", 1))
    assert len(fn.jit_calls) == 1 and fn.kernel.runs[0][-5:] == (x, 7, False, 16, False)
    fl[(3,)](x, 7, False, BLOCK=32, _key=("a", 2))
    assert len(fn.jit_calls) == 2 and fn.jit_calls[1][2] == dict(BLOCK=32)
