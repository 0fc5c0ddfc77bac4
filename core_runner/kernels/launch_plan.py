"""A call's Triton launches recorded once and replayed with the call's new input pointers.

``fast_launch`` cuts the per-launch work to a key lookup, but a launch of the split
sampler still cost ~35 us of host time on the H200 image (session 11: 137 us for a cut
call of four launches; the compiled kernel's own ``run`` with 30 arguments takes 6-8 us):
building the argument list from the kwargs, the specialisation key, the stream lookup,
and in triton's C launcher one ``data_ptr()`` call and one ``cuPointerGetAttribute`` per
tensor. A plan keeps, per launch, the compiled kernel, its grid and its full argument
list with every tensor turned into its address, except the call's inputs, whose slots are
filled with the new addresses on each replay; the launcher takes an int for a pointer as
is.

Use: run the call's launches once inside ``record()`` (through ``fast_launch``); if every
launch was recorded, ``LaunchPlan(steps, inputs)`` replays them. The caller must key the
plan by everything that fixes the launches (grids, constexprs, options, the inputs'
dtypes and alignment) and keep it no longer than the tensors it holds as addresses (the
split sampler stores its plans on the workspace that owns those tensors). A replay runs
no launch hooks: callers replay only while triton has none set (``fast_launch.hooks_set``).
"""
from __future__ import annotations

import torch
from core_runner.kernels import fast_launch


class record:
    """Context: the launches made through ``fast_launch`` inside it, as (compiled kernel or
    None when a launch could not be recorded, grid, full argument list)."""

    def __enter__(self) -> list:
        self.steps: list = []
        fast_launch.RECORDER = self.steps
        return self.steps

    def __exit__(self, *exc) -> None:
        fast_launch.RECORDER = None


class LaunchPlan:
    def __init__(self, steps: list, inputs: tuple[torch.Tensor, ...]):
        if any(kernel is None for kernel, _, _ in steps):
            raise ValueError("a launch of the recorded call did not go through fast_launch: no plan")
        where = {id(t): j for j, t in enumerate(inputs)}
        self.steps = []
        for kernel, grid, full in steps:
            args, slots = [], []
            for pos, a in enumerate(full):
                if isinstance(a, torch.Tensor):
                    j = where.get(id(a))
                    if j is None:
                        args.append(a.data_ptr())
                    else:
                        args.append(0)
                        slots.append((pos, j))
                else:
                    args.append(a)
            self.steps.append((kernel, grid, args, tuple(slots)))

    def replay(self, ptrs: list[int], stream: int) -> None:
        """The recorded launches on ``stream`` (a raw CUDA stream handle) with the inputs at
        ``ptrs`` (addresses, in the order of the inputs given at construction)."""
        for kernel, grid, args, slots in self.steps:
            for pos, j in slots:
                args[pos] = ptrs[j]
            kernel.run(grid[0], grid[1], grid[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                       *args)
