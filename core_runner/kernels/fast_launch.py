"""Launching a Triton kernel through its compiled kernel, without ``JITFunction.run``'s
per-call work (on by default; ``CORE_RUNNER_FAST_LAUNCH=0``, or ``fast_launch.ENABLED =
False``, sends every launch through ``fn[grid]``).

On the H200 image (triton 3.6) one launch of the split sampler's round kernel (27 runtime
arguments, 20 constexprs) cost ~45-75 us of host time (session 8, cProfile of
``benchmarks/sampler_host.py``): the binder specialises every argument, the cache key is
built, the launch metadata is gathered, and only then does the C launcher run. With four
launches a Sampler call took 240-450 us of host time against 0.273 ms of GPU time.

``fast(fn)[grid](*args, **kwargs)`` keys each call by what triton specialises on (per
tensor: dtype and 16-byte alignment; per int: == 1, divisible by 16, fits int32; the
constexprs' values; the launch options; the device). The first call of a key goes through
``fn[grid]`` (which compiles if needed and returns the compiled kernel); later calls hand
the arguments straight to ``CompiledKernel.run`` the way ``JITFunction.run`` does in
triton 3.6 and 3.9. Off, or under the interpreter, ``fast(fn)[grid]`` is ``fn[grid]``.

Working out that key costs a Python call per argument (~1 us each on the H200 image, where
the split sampler's launches have 40-50 arguments: session 9's profile). A caller that
knows what determines the specialisation passes it instead, ``fast(fn)[grid](..., _key=k)``:
k must fix every constexpr, launch option, tensor dtype and 16-byte alignment, and the
ints' specialisations (the split sampler keys on its workspace, shapes, options and the
alignment of its input tensors).
"""
from __future__ import annotations

import os

import torch
from triton import knobs

# on since session 9: with the split sampler's keys (H200, torch 2.11, triton 3.6) a cut call
# took 150 us of host time against 224, a Sampler call 168 against 243, and the bench's
# top-p case 0.292 ms against 0.365, 0 rows off the torch reference (benchmarks/RESULTS.md)
ENABLED = os.environ.get("CORE_RUNNER_FAST_LAUNCH", "1") == "1"


def _spec(v):
    """What triton's specialisation sees of a runtime argument (conservatively)."""
    if isinstance(v, torch.Tensor):
        return ("t", v.dtype, v.data_ptr() % 16 == 0)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v == 1, v % 16 == 0, -2**31 <= v < 2**31)
    if isinstance(v, float):
        return ("f",)
    return ("o", v)


_CUDA = torch.cuda.is_available()
# a list while ``launch_plan.record`` runs: every launch appends (compiled kernel or None, grid, arguments)
RECORDER: list | None = None


def _device() -> int:
    return torch.cuda.current_device() if _CUDA else -1


def _stream() -> int:
    """The current CUDA stream's handle (the call triton makes itself)."""
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device()) if _CUDA else 0


def hooks_set() -> bool:
    """Triton has a launch hook set (a profiler's, say): triton 3.5+ holds them in HookChain
    objects, there and empty when none is set; older ones in a plain attribute, None then."""
    return any(h is not None and bool(getattr(h, "calls", True))
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class FastLaunch:
    def __init__(self, fn):
        self.fn = fn
        self.enabled: bool | None = None  # None: the module's ENABLED
        self.cache: dict[tuple, object] = {}
        self.names: list[str] = []  # (read off fn on the first fast call: the interpreter's kernels lack params)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        on = ENABLED if self.enabled is None else self.enabled
        caller_key = kwargs.pop("_key", None)
        if not on or not hasattr(self.fn, "params"):  # off, or the interpreter's kernel
            if RECORDER is not None:
                RECORDER.append((None, grid, args))
            return self.fn[grid](*args, **kwargs)
        if not self.names:
            self.names = list(self.fn.arg_names)
            self.name_set = set(self.names)
            self.constexpr = [p.is_constexpr for p in self.fn.params]
            self.defaults = [p.default for p in self.fn.params]
        n = len(args)
        full = list(args) + [kwargs.get(name, d) for name, d in zip(self.names[n:], self.defaults[n:])]
        if caller_key is not None:
            key = (_device(), caller_key)
        else:
            options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.name_set))
            key = (_device(), options, tuple(v if ce else _spec(v) for v, ce in zip(full, self.constexpr)))
        kernel = self.cache.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **kwargs)  # compiles (or finds) and launches
            if kernel is not None and hasattr(kernel, "run"):
                self.cache[key] = kernel
            if RECORDER is not None:
                RECORDER.append((kernel if hasattr(kernel, "run") else None, tuple(grid) + (1, 1), full))
            return kernel
        g = tuple(grid) + (1, 1)
        if RECORDER is not None:
            RECORDER.append((kernel, g, full))
        stream = _stream()
        if hooks_set():
            kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata,
                       kernel.launch_metadata(grid, stream, *full), knobs.runtime.launch_enter_hook,
                       knobs.runtime.launch_exit_hook, *full)
        else:  # (no hook: no launch metadata to gather, and the launcher calls none)
            kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None, *full)
        return kernel


_FAST: dict[object, FastLaunch] = {}


def fast(fn) -> FastLaunch:
    """The FastLaunch of a @triton.jit kernel (one per kernel)."""
    got = _FAST.get(fn)
    if got is None:
        got = _FAST[fn] = FastLaunch(fn)
    return got
