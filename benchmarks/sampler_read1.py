"""Where read 1 of the split sampler spends its time, and other launch shapes (session 10).

For the bench's top-p case ([1024 x 151,936] fp32, N(0, 4^2) logits, temperature 0.7,
top-p 0.9), GPU times from CUDA-graph replays (each variant ``--reps`` times, interleaved; min and
median) of:

  full       the whole cut call at the Sampler's shape (read 1 with the fused decide, read
             2, two rounds); full_reg96: read 1's register cap 96, not 128
             (``FUSED_MAXNREG``; session 10, call 7: 0.253-0.263 ms against 0.245 at 128,
             when 96 was the default); full_dw4: the decide as a launch of its own (4 warps);
             full_dw2 / full_dw8: that launch with 2 / 8 warps (full_dw2_w1024: with
             decide_width 1,024); full_r1: one histogram round after read 2, not two;
             full_wide: the lists' draw on all their slots (``narrow_draw=False``);
             full_dw1024(_reg96): the entries above T moved first, the draw on 1,024 slots
             (``decide_width``; sm90: read 1 then fits in 96 registers without spills);
             _pdl: programmatic dependent launches (``PDL_LAUNCH``); _ahead3: read 1's loop
             with 3 tiles in flight, not 2 (``READ1_AHEAD``)
  read1      read 1 alone, not fused (lists pass, list and part stores; no decide)
  fused      read 1 alone with the fused decide (the rows it sends on are dropped)
  decide4    the decide as a launch of its own (4 warps) after an unfused read 1 (its
             time is the pair's minus read1's); decide2: the Sampler's (2 warps, 1,024 slots)

Session 11 made the Sampler's shape the decide of its own launch on 2 warps and 1,024
slots with programmatic dependent launches; full_fused is the earlier shape (the decide
fused into read 1), full_nopdl the Sampler's without PDL.

(the launches left out are skipped by wrapping ``fast``; the work list counters they
would put back are zeroed by a torch op in the graph, timed alone as ``reset``); with
``--shapes`` the full call at other launch shapes (split, warps, list slots, tile
width), with rows per path and rows off the torch reference (session 10, call 3: the
Sampler's s8 w2 l256 b512 0.255 ms; s4 w2 l512 0.272, s4 w4 0.315, s8 w4 0.306, s16 w2
l128 2.06, s8 w4 b1024 1.52).

Usage (GPU): python3 benchmarks/sampler_read1.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json

import torch

import core_runner.kernels.cut_sample_split_triton as cs
from core_runner.bench.sampler_bench import bench_top_p_case, graph_ms
from core_runner.kernels.cut_sample_triton import sample_with_cuts_triton
from core_runner.kernels.top_k_top_p import top_k_top_p_threshold_ref
from core_runner.sample.sampler import cut_shape, gumbel_sample_ref

SHAPES = [dict(split=8, num_warps=2, list_slots=256, block=512),  # the Sampler's
          dict(split=4, num_warps=2, list_slots=512, block=512),
          dict(split=4, num_warps=4, list_slots=512, block=512),
          dict(split=8, num_warps=4, list_slots=256, block=512),
          dict(split=16, num_warps=2, list_slots=128, block=512),
          dict(split=8, num_warps=4, list_slots=256, block=1024)]


class _Skip:
    def __getitem__(self, grid):
        return lambda *a, **k: None


def _only(names: set):
    real = cs.fast
    return lambda fn: real(fn) if fn.__name__ in names else _Skip()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", action="store_true", help="also the full call at the other launch shapes")
    ap.add_argument("--parts", help="comma-separated names of the variants to time (default: all)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    logits, m, out, paths = bench_top_p_case(dev)
    want = gumbel_sample_ref(logits, m.inv_temp, m.seeds, m.positions,
                             top_k_top_p_threshold_ref(logits, m.inv_temp, m.top_k, m.top_p, m.log_min_p))
    res: dict = {}
    reps = args.reps
    held: list = []
    real_ws = cs.split_workspace

    def keep_ws(*a, **k):
        ws = real_ws(*a, **k)
        held[:] = [ws]
        return ws

    cs.split_workspace = keep_ws
    base = cut_shape(m)  # the Sampler's

    def call(shape, reset=False):
        def f():
            sample_with_cuts_triton(logits, m.inv_temp, m.seeds, m.positions, m.top_k, m.top_p, m.log_min_p,
                                    out=out, paths=paths, **shape)
            if reset:
                held[0].work.zero_()
        return f

    real_fast = cs.fast
    w2 = dict(decide_warps=2, decide_width=1024)
    # (name, the only kernels launched (None: all), options of the call, module settings patched for it)
    parts = [("full", None, {}, {}), ("full_reg96", None, {}, dict(FUSED_MAXNREG=96)),
             ("full_dw4", None, dict(decide_warps=4), {}),
             ("full_dw2", None, dict(decide_warps=2), {}), ("full_dw8", None, dict(decide_warps=8), {}),
             ("full_dw2_w1024", None, w2, {}),
             ("full_r1", None, dict(rounds=1), {}),
             ("full_pdl", None, {}, dict(PDL_LAUNCH=True)), ("full_ahead3", None, {}, dict(READ1_AHEAD=3)),
             ("full_dw2_w1024_pdl", None, w2, dict(PDL_LAUNCH=True)),
             ("full_dw2_w1024_ahead3", None, w2, dict(READ1_AHEAD=3)),
             ("full_dw2_w1024_pdl_ahead3", None, w2, dict(PDL_LAUNCH=True, READ1_AHEAD=3)),
             ("full_wide", None, dict(narrow_draw=False), {}),
             ("full_dw1024", None, dict(decide_width=1024), {}),
             ("full_dw1024_reg96", None, dict(decide_width=1024), dict(FUSED_MAXNREG=96)),
             ("full_fused", None, dict(decide_warps=0, decide_width=0), {}),
             ("full_nopdl", None, {}, dict(PDL_LAUNCH=False)),
             ("read1", {"_read1_kernel"}, dict(decide_warps=4), {}),
             ("fused", {"_read1_kernel"}, dict(decide_warps=0, decide_width=0), {}),
             ("decide2", {"_read1_kernel", "_decide_kernel"}, {}, {}),
             ("read1_ahead3", {"_read1_kernel"}, dict(decide_warps=4), dict(READ1_AHEAD=3)),
             ("decide4", {"_read1_kernel", "_decide_kernel"}, dict(decide_warps=4), {})]
    if args.parts:
        parts = [p for p in parts if p[0] in args.parts.split(",")]
    defaults = {name: getattr(cs, name) for name in ("FUSED_MAXNREG", "PDL_LAUNCH", "READ1_AHEAD", "LAUNCH_PLANS")}
    try:
        times: dict = {name: [] for name, _, _, _ in parts}
        for _rep in range(reps):  # interleaved, so that a drift of the clocks hits every variant alike
            for name, kernels, extra, patch in parts:
                cs.fast = _only(kernels) if kernels else real_fast
                # (a plan would replay the launches the wrapper leaves out)
                for key, v in dict(patch, LAUNCH_PLANS=kernels is None).items():
                    setattr(cs, key, v)
                try:
                    times[name].append(graph_ms(call(dict(base, **extra), reset=kernels is not None), dev, 10, 2))
                    if kernels is None:  # a whole call: its tokens (the graph's last replay) against the reference
                        res[f"{name}_rows_off"] = int((out != want).sum())
                except Exception as e:  # (one variant failing to compile or run leaves the others their figures)
                    res[f"{name}_error"] = repr(e)[:500]
                    print(f"  {name}: {res[f'{name}_error']}", flush=True)
                finally:
                    cs.fast = real_fast
                    for key, v in defaults.items():
                        setattr(cs, key, v)
        for name, ts in times.items():
            if not ts:
                continue
            res[name] = dict(min=min(ts), median=sorted(ts)[len(ts) // 2], all=ts)
            off = res.get(f"{name}_rows_off")
            print(f"  {name}: min {min(ts):.4f} ms, median {res[name]['median']:.4f} ms"
                  + ("" if off is None else f", rows off the reference {off}"), flush=True)
        call(base)()
        res["reset"] = graph_ms(lambda: held[0].work.zero_(), dev, 10, 2)
        print(f"  reset: {res['reset']:.4f} ms", flush=True)
        for shape in SHAPES if args.shapes else []:
            sh = dict(base, **shape)
            key = "s{split}_w{num_warps}_l{list_slots}_b{block}".format(**shape)
            call(sh)()
            off = int((out != want).sum())
            kinds = {int(k): int(c) for k, c in zip(*torch.unique(paths, return_counts=True))}
            res[key] = dict(gpu_ms_graph=graph_ms(call(sh), dev, 10, 2), paths=kinds, rows_off=off)
            print(f"  {key}: graph {res[key]['gpu_ms_graph']:.4f} ms, paths {kinds}, rows off {off}", flush=True)
    finally:
        cs.fast = real_fast
        for key, v in defaults.items():
            setattr(cs, key, v)
        cs.split_workspace = real_ws
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sampler_read1": res}, f, indent=1)
    return res


if __name__ == "__main__":
    main()
