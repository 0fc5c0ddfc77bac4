"""Compile the sampler's Triton kernels for an H100/H200 (sm90) on a machine without a GPU.

The launchers run on small CPU tensors with ``JITFunction.run`` replaced: every launch is
compiled for ``GPUTarget("cuda", 90, 32)`` from the arguments it was given (pointer and
integer types, the constexprs, num_warps) instead of being run. A kernel the GPU
compiler rejects (e.g. triton 3.6's layout pass crashing on a tensor-carrying while
loop) fails here, before any device time is spent. Run it with TRITON_INTERPRET unset
(the interpreter never compiles):

    python tests/kernels/sm90_compile.py            # every case, prints one line each
    python tests/kernels/sm90_compile.py --usage CASE ...   # + registers, stack, spills per kernel

``--usage`` reads each cubin's resource usage with triton's own cuobjdump: registers per
thread bound the programs an SM holds at once, and a kernel whose rare path needs a wide
sort pays that on every row.

To check another triton (the GPU image has 3.6): install it with
``pip install --no-deps --target DIR triton==3.6.0`` and put DIR first on PYTHONPATH.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

_PTR = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int64: "*i64",
        torch.int32: "*i32", torch.int8: "*i8", torch.uint8: "*u8", torch.bool: "*i1"}


def _compile_launch(fn: JITFunction, args: tuple, kwargs: dict) -> str:
    """Compile one launch for sm90; returns the kernel's name."""
    names = fn.arg_names
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    options = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages", "maxnreg", "launch_pdl")}
    sig, const, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(names, fn.params)):
        value = bound.get(name, param.default)
        if param.is_constexpr:
            sig[name] = "constexpr"
            const[name] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = _PTR[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value is None:
            sig[name] = "constexpr"
            const[name] = None
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__} is not handled")
    ck = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=options)
    return fn.__name__ + (f" [{_usage(ck.asm['cubin'])}]" if USAGE else "")


USAGE = False  # --usage: append each kernel's resource usage to its name


def _usage(cubin: bytes) -> str:
    """'REG:n STACK:n SHARED:n LOCAL:n' of a cubin (cuobjdump --dump-resource-usage)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", out)
    return found.group(0) if found else out.strip()[-120:]


class compiling_for_sm90:
    """Context manager: launches inside compile for sm90 instead of running; the names of
    the compiled kernels collect in ``.compiled``."""

    def __enter__(self):
        from core_runner.kernels import cut_sample_split_triton as split

        self.compiled: list[str] = []
        self._run = JITFunction.run
        self._asm = split.ASM_STORES
        split.ASM_STORES = True  # the GPU's form of read 1's scattered stores (CPU tensors would pick tl.store)

        def run(fn, *args, grid, warmup, **kwargs):
            self.compiled.append(_compile_launch(fn, args, kwargs))

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        from core_runner.kernels import cut_sample_split_triton as split

        JITFunction.run = self._run
        split.ASM_STORES = self._asm
        return False


def sampler_cases(n: int = 8, vocab: int = 5000) -> dict:
    """name -> zero-argument callable that launches one sampler path on CPU tensors: the
    one-program kernels and the split ones at the Sampler's shapes and a few others."""
    from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
    from core_runner.kernels.gumbel_sample import gumbel_sample_triton
    from core_runner.sample.sampler import CUT_SHAPE

    x = torch.randn(n, vocab)
    inv = torch.full((n,), 1.3)
    seeds = torch.arange(n)
    pos = torch.full((n,), 7)
    k = torch.full((n,), -1, dtype=torch.int32)
    p = torch.full((n,), 0.9)
    lmp = torch.full((n,), -float("inf"))
    cases = {
        "gumbel": lambda: gumbel_sample_triton(x, inv, seeds, pos),
        "cut": lambda: sample_with_cuts_triton(x, inv, seeds, pos, k, p, lmp),
        "cut_block256_cap16": lambda: sample_with_cuts_triton(x, inv, seeds, pos, k, p, lmp, block=256, cap=16),
    }
    cases["cut_sampler_shape"] = lambda: sample_with_cuts_triton(x, inv, seeds, pos, k, p, lmp, **CUT_SHAPE)
    # the Sampler's top-p-only batches: read 1 with the fused decide
    cases["cut_sampler_all_top_p"] = lambda: sample_with_cuts_triton(x, inv, seeds, pos, k, p, lmp, **CUT_SHAPE,
                                                                     all_top_p=True)
    def pdl_ahead3():  # programmatic dependent launches, read 1 three tiles ahead, the decide of 2 warps on 1,024
        import core_runner.kernels.cut_sample_split_triton as cs

        saved = cs.PDL_LAUNCH, cs.READ1_AHEAD, cs.pdl_supported
        cs.PDL_LAUNCH, cs.READ1_AHEAD, cs.pdl_supported = True, 3, lambda dev: True
        try:
            sample_with_cuts_triton(x, inv, seeds, pos, k, p, lmp, **dict(CUT_SHAPE, decide_warps=2, decide_width=1024),
                                    all_top_p=True)
        finally:
            cs.PDL_LAUNCH, cs.READ1_AHEAD, cs.pdl_supported = saved

    cases["cut_sampler_pdl_ahead3"] = pdl_ahead3
    cases["cut_s8_b512_w1_nucleus_first"] = lambda: sample_with_cuts_triton(
        x, inv, seeds, pos, k, p, lmp, split=8, block=512, num_warps=1, nucleus_first=True)
    from core_runner.bench.sampler_bench import SWEEP_SHAPES

    for sh in SWEEP_SHAPES:  # the bench's sweep (nucleus first with lane lists)
        name = "cut_s{split}_b{block}_w{num_warps}_cap{cap}_L{lists}x{list_slots}".format(**sh)
        name += "" if sh.get("tile_max", True) else "_nt"
        cases[name] = lambda sh=sh: sample_with_cuts_triton(x, inv, seeds, pos, k, p, lmp, **sh)
    def probe(mode):  # the probe's read 1 of the lane lists (benchmarks/ is not installed)
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from benchmarks.sampler_probe import probe as run

        return run(x, mode, 8, 512, 2)

    for mode in ("lists3", "lists3nt", "lists2"):
        cases[f"probe_{mode}"] = lambda mode=mode: probe(mode)
    def scatter():  # the inline PTX store of read 1's lists (``scatter_store``), alone
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from test_scatter_store import _compact_kernel

        _compact_kernel[(1,)](x[0, :512].contiguous(), x[1, :512].contiguous(), pos[:1].to(torch.int32), 0.5,
                              B=512, ASM=True, num_warps=2)

    cases["scatter_store"] = scatter
    for s, b, w in ((2, 2048, 8), (4, 512, 1), (8, 512, 1), (16, 256, 1)):
        cases[f"gumbel_s{s}_b{b}_w{w}"] = lambda s=s, b=b, w=w: gumbel_sample_triton(
            x, inv, seeds, pos, split=s, block=b, num_warps=w)
        cases[f"cut_s{s}_b{b}_w{w}"] = lambda s=s, b=b, w=w: sample_with_cuts_triton(
            x, inv, seeds, pos, k, p, lmp, split=s, block=b, num_warps=w)
    return cases


def main(names: list[str]) -> int:
    global USAGE
    if "--usage" in names:
        USAGE = True
        names = [n for n in names if n != "--usage"]
    cases = sampler_cases()
    failed = 0
    for name in names or list(cases):
        t = time.perf_counter()
        try:
            with compiling_for_sm90() as c:
                cases[name]()
            print(f"ok   {name}: {', '.join(c.compiled)} ({time.perf_counter() - t:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 (report every case)
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[-300:]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
