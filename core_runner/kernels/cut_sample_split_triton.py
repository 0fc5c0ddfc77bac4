"""The fused cut sampler with each row spread over S programs (``split`` of
``sample_with_cuts_triton``): the same tokens as the one-program-per-row kernel of
``cut_sample_triton.py`` (whose docstring holds the definitions and the arguments), in
3 + ``rounds`` launches (4 + rounds with nucleus first, 2 + rounds when every row is top-p
alone with lane lists and ``decide_warps`` 0: the decide then runs at the end of read 1;
the Sampler's shape keeps it a launch of its own, which measured faster since session 11)
and no host read. On sm90+ the launches are programmatic dependent launches
(``PDL_LAUNCH``, ``grid_dependency``), and a call's launches are replayed from a launch
plan kept on the workspace (``LAUNCH_PLANS``, ``launch_plan``).

1. ``_read1_kernel`` (S x rows, a row's programs one after another; twice with nucleus
   first): every program draws over its part of the row (whole tiles) and keeps the
   part's token, max, mass relative to it, finite count, tile maxima and lanes' maxima
   (the readers take the max over the parts: the parts are whole tiles, so a lane is the
   same column residue in every part).
2. ``_decide_kernel`` (rows): the row's token from the parts' tokens, m, Z and the
   finite count. Greedy, no cut, or a draw on the row max: done. Top-p alone: the lane
   floor F and the value read 2 must pass (x_t, or the float under F when x_t < F: then
   the draw is out whatever read 2 finds), and the first bracket of the histogram rounds.
   Any other cut: left to step 3's finish. Every row left open goes on a work list.
3. ``_round_kernel`` with FIRST (``split_read2_triton``; a fixed grid over the list's
   (row, chunk) items): for the top-p rows, each chunk sums mass{x > lo}, stores those
   tokens as candidates and, for the rounds, a histogram; the last chunk of a row
   finishes it (``split_finish_triton``): A < p Z keeps the draw; else the candidates
   give the threshold and the redraw, or, past 256 candidates, the row goes on to the
   rounds. Rows with top-k or min-p take the one-program path (``_cut_row``) here, with
   the merged lane maxima (their second maxima are not kept, which only loosens the top-k
   lower bound L; the same result).
4. ``_round_kernel``, ``rounds`` times (``split_rounds_triton``): histogram rounds over
   many programs narrow the bracket that holds v_p until it can be gathered, and the
   gathered rows draw (path 4); a row still searching in the last round takes the
   one-program pivot search (path 3).

Nucleus first (``nucleus_first``): the draw of read 1 hashes every token the noise
bound cannot rule out, which makes that pass compute-bound (1.5 reads where a bare read
costs 1.0). A row with top-p alone (top-k <= 0, no min-p) needs the draw only inside its
nucleus S = {x >= v_p}: the answer is argmax over S of x + g whatever the draw was. So
its read 1 keeps the statistics alone (lane maxima, tile maxima, Z, finite count; no
hash) in a launch of its own, compiled without the draw (96 registers against 220 on
sm90; a second read-1 launch draws the batch's other rows). Step 2 reads the floor
F <= v_p off the lane maxima and sends every such row to read 2 for the tokens >= F, and
step 4 computes v_p from those candidates and draws among the ones >= v_p (path 7; more
than CAP candidates: the pivot search, path 3). Read 2 touches only the tiles whose max
is >= F: on peaked rows a handful. Other rows of the batch draw in read 1 as before.

Lane lists (``lists`` 2 or 3, with nucleus first; ``lane_lists_triton``): the top-p rows'
read 1 also keeps each lane's top entries and stores, per part, every token above the
part's bound; the decide launch then draws most rows among their exact nucleus (path 8)
and only the others go on to read 2 and the finish. ``all_top_p`` leaves out the read-1
launch of the other rows when the caller knows there are none (the Sampler does, from
its host mirror).
"""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from core_runner.kernels.cut_sample_triton import lane_floor
from core_runner.kernels import fast_launch
from core_runner.kernels.fast_launch import fast, hooks_set
from core_runner.kernels.grid_dependency import grid_dependency, pdl_supported
from core_runner.kernels.launch_plan import LaunchPlan, record
from core_runner.kernels.lane_lists_triton import lane_lists_pass, nucleus_from_lists, store_lane_list
from core_runner.kernels.scatter_store import scatter_store
from core_runner.kernels.split_finish_triton import _DONE, _ONE_PROGRAM, _READ2, _lane_maxima
from core_runner.kernels.split_read2_triton import _round_kernel, read2_grid
from core_runner.kernels.split_rounds_triton import first_bracket
from core_runner.kernels.split_workspace import HIST_PIVOTS, MAX_ROUNDS, chunk_cols, discard, split_workspace
from core_runner.kernels.gumbel_sample import (
    argmax_pass, combine_part_tokens, gumbel_pass, row_keys, row_part, use_fast_log,
)
from core_runner.kernels.top_k_top_p_triton import _key, _value

# read 1's scattered stores (its lists, a part's count and Z) by inline PTX (``scatter_store``): None, on CUDA
# tensors (the interpreter runs no PTX); True / False: always / never (the sm90 compile check and the GPU test of
# both forms set it)
ASM_STORES: bool | None = None
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# registers of read 1 with the fused decide: the decide alone would take ~190 (sm90), which
# would halve the read-1 programs an SM holds; capped, the decide (one program in n_parts)
# spills a little instead (112 bytes). Since session 10's epilogue (one reduction, one scan,
# ``scatter_store``) the loop and epilogue alone fit in 96 (10 programs of 2 warps per SM, not
# 8), but a cap of 96 spills ~400 bytes in the decide and was slower on the H200: graph
# 0.253-0.263 ms against 0.245 at 128 (benchmarks/RESULTS.md, session 10)
FUSED_MAXNREG = 128
# tiles in flight ahead of the one being processed in read 1's lists loop (2 or 3)
READ1_AHEAD = 2
# programmatic dependent launches (``grid_dependency``) for every launch of a call, where the device has them
# (sm90+, not the interpreter): each launch's programs wait on the SMs for the one before, which hides the launch
# latencies between the short launches after read 1 (H200, session 11: graph 0.2186 against 0.2201 ms)
PDL_LAUNCH = True
# replay a call's launches from the workspace's launch plan (``launch_plan``) once recorded
LAUNCH_PLANS = True


@triton.jit
def _nucleus_first_row(top_k_ptr, top_p_ptr, lmp_ptr, i):
    """Row i cuts with top-p alone (top-k off whatever the finite count, no min-p):
    with ``nucleus_first`` its read 1 keeps the statistics only."""
    return (tl.load(top_p_ptr + i) < 1.0) & (tl.load(top_k_ptr + i) <= 0) & (tl.load(lmp_ptr + i) == -float("inf"))


@triton.jit
def _send_to_read2(row_f_ptr, row_i_ptr, brk_ptr, i, mode, m, z, p, lo, x_t, a1, vocab, BLOCK: tl.constexpr,
                   NPV: tl.constexpr):
    """The decide launch's record of a row for read 2 and the finish: mode 1 tests a draw
    (A = mass{x > lo} against p Z), mode 2 gathers the nucleus (the tokens > lo hold it);
    and the first bracket of the histogram rounds (``split_rounds_triton``), flagged for
    read 2's histogram when more than half of the lanes' maxima (a1) are above lo (a flat
    row: each is a candidate, so at the Sampler's shape, 512 lanes, its candidates overflow
    read 2's 256; session 8's eighth also flagged peaked rows the lane lists miss, whose
    read 2 then paid for a histogram it did not use)."""
    wide = tl.sum((a1 > lo).to(tl.int32), axis=0) > BLOCK // 2
    first_bracket(brk_ptr + i * (NPV + 4), m, z, p, lo, mode == 2, wide, vocab, NPV)
    tl.store(row_i_ptr + i * 4 + 3, mode)
    tl.store(row_f_ptr + i * 4, m)
    tl.store(row_f_ptr + i * 4 + 1, z)
    tl.store(row_f_ptr + i * 4 + 2, lo)
    tl.store(row_f_ptr + i * 4 + 3, x_t)


@triton.jit
def _store_part_stats(a1, tmax, m, z, nf, tok, i, s, lo, hi, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr,
                      n_parts, n_tiles, BLOCK: tl.constexpr, NTP: tl.constexpr, ASM: tl.constexpr):
    """What every read-1 program leaves for the later launches: its lanes' maxima (the
    readers merge the parts', ``_lane_maxima``: plain stores, where an atomic max per lane
    into one row would cost 4M atomics a call at [1024 x 151,936]), tile maxima, max,
    mass (z: [BLOCK], the last lane's is stored: ``store_lane_list``'s running sum),
    finite count and token."""
    lanes = tl.arange(0, BLOCK)
    tl.store(a1_ptr + (i * n_parts + s).to(tl.int64) * BLOCK + lanes, a1)
    tiles = lo // BLOCK + tl.arange(0, NTP)
    tl.store(tmax_ptr + i.to(tl.int64) * n_tiles + tiles, tmax, mask=tiles * BLOCK < hi)
    at = (i * n_parts + s).to(tl.int64)
    tl.store(part_f_ptr + at * 2, m)
    scatter_store(part_f_ptr + at * 2 + 1 + lanes * 0, z, lanes == BLOCK - 1, ASM)
    tl.store(part_nf_ptr + at, nf)
    tl.store(part_tok_ptr + at, tok.to(tl.int64))


@triton.jit
def _read1_part(row, hi, inv_t, k1, k2, i, s, lo, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr, n_parts,
                n_tiles, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, NTP: tl.constexpr, DRAW: tl.constexpr,
                ASM: tl.constexpr):
    """Read 1 of program (i, s) on a sampled row: the part's token (DRAW) and statistics."""
    t, a1, _a2, nf, z, tmax = gumbel_pass(row, hi, inv_t, 0.0, k1, k2, False, True, False, True, FAST_LOG,
                                          BLOCK, NTP, 1, lo, DRAW)
    _store_part_stats(a1, tmax, tl.max(a1, axis=0), z + tl.zeros([BLOCK], tl.float32), nf, t, i, s, lo, hi,
                      part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr, n_parts, n_tiles, BLOCK, NTP, ASM)


@triton.jit
def _read1_lists_part(row, hi, inv_t, i, s, lo, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr, lx_ptr,
                      li_ptr, ln_ptr, lb_ptr, n_parts, n_tiles, BLOCK: tl.constexpr, NTP: tl.constexpr,
                      DEPTH: tl.constexpr, LIST: tl.constexpr, TMAX: tl.constexpr, ASM: tl.constexpr,
                      AHEAD: tl.constexpr):
    """Read 1 of program (i, s) on a nucleus-first row with lane lists: the statistics of
    ``_read1_part`` (no draw: the part token is lo, a valid column, which the decide
    does not combine) and the part's list (``lane_lists_triton``)."""
    a1, i1, a2, i2, _bound, b, nf, m, zl, tmax = lane_lists_pass(row, lo, hi, inv_t, BLOCK, NTP, DEPTH, TMAX, AHEAD)
    at = (i * n_parts + s).to(tl.int64)
    zs = store_lane_list(a1, i1, a2, i2, b, zl, lx_ptr + at * LIST, li_ptr + at * LIST, ln_ptr + at,
                         lb_ptr + at, DEPTH, LIST, ASM)
    _store_part_stats(a1, tmax, m, zs, nf, lo, i, s, lo, hi, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr,
                      tmax_ptr, n_parts, n_tiles, BLOCK, NTP, ASM)


@triton.jit
def _read1_kernel(logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr, part_tok_ptr,
                  part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr, lx_ptr, li_ptr, ln_ptr, lb_ptr, row_f_ptr, row_i_ptr,
                  out_ptr, path_ptr, work_ptr, brk_ptr, ticket_ptr, vocab, part, n_parts, n_tiles,
                  FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, NTP: tl.constexpr, ROWS: tl.constexpr,
                  DEPTH: tl.constexpr, LIST: tl.constexpr, TMAX: tl.constexpr, ALL: tl.constexpr, FUSE: tl.constexpr,
                  P: tl.constexpr, NPV: tl.constexpr, NARROW: tl.constexpr, ASM: tl.constexpr, DW: tl.constexpr,
                  AHEAD: tl.constexpr = 2, PDL: tl.constexpr = False):
    """ROWS 0: every row (draw first). Nucleus first launches it twice: ROWS 1 for the
    top-p-alone rows (statistics only: no draw code compiled in, so few registers) and
    ROWS 2 for the others (draw or argmax). ALL (the caller's promise that every row is
    top-p alone): ROWS 1 only; a row that breaks it gets a valid part token here and
    token -1 (path 9) in the decide launch. FUSE (with ALL): no decide launch; the last
    program of a row to finish read 1 (a ticket per row, taken after a barrier with an
    acquire-release atomic, so the other parts' stores are visible to it) decides the
    row and puts the ticket back to 0. AHEAD: tiles in flight in the lists' loop; PDL:
    launched as a programmatic dependent launch (``grid_dependency``)."""
    grid_dependency(PDL)
    i, s, row, lo, hi, inv_t = row_part(logits_ptr, s_row, inv_t_ptr, vocab, part, True)
    nucleus = False
    if ROWS != 0:
        nucleus = (inv_t > 0) & _nucleus_first_row(top_k_ptr, top_p_ptr, lmp_ptr, i)
    if ROWS == 1:
        if nucleus:
            if DEPTH > 0:
                _read1_lists_part(row, hi, inv_t, i, s, lo, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr,
                                  lx_ptr, li_ptr, ln_ptr, lb_ptr, n_parts, n_tiles, BLOCK, NTP, DEPTH, LIST, TMAX,
                                  ASM, AHEAD)
            else:
                _read1_part(row, hi, inv_t, 0, 0, i, s, lo, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr,
                            n_parts, n_tiles, FAST_LOG, BLOCK, NTP, False, ASM)
        elif ALL:
            tl.store(part_tok_ptr + i * n_parts + s, lo.to(tl.int64))
    elif not nucleus:
        if inv_t > 0:
            k1, k2 = row_keys(seed_ptr, pos_ptr, i)
            _read1_part(row, hi, inv_t, k1, k2, i, s, lo, part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, tmax_ptr,
                        n_parts, n_tiles, FAST_LOG, BLOCK, NTP, True, ASM)
        else:
            tl.store(part_tok_ptr + i * n_parts + s, argmax_pass(row, hi, BLOCK, 1, lo).to(tl.int64))
    if FUSE:
        tl.debug_barrier()  # every thread's stores of this program before the ticket
        if tl.atomic_add(ticket_ptr + i, 1, sem="acq_rel") == n_parts - 1:
            tl.store(ticket_ptr + i, 0)
            _decide_row(i, logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
                        part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, row_f_ptr, row_i_ptr, out_ptr, path_ptr,
                        work_ptr, brk_ptr, lx_ptr, li_ptr, ln_ptr, lb_ptr, n_parts, vocab, FAST_LOG, BLOCK, P, True,
                        DEPTH, LIST, ALL, NPV, NARROW, ASM, DW)


@triton.jit
def _decide_kernel(logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
                   part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, row_f_ptr, row_i_ptr, out_ptr, path_ptr, work_ptr,
                   brk_ptr, lx_ptr, li_ptr, ln_ptr, lb_ptr, n_parts, vocab, FAST_LOG: tl.constexpr,
                   BLOCK: tl.constexpr, P: tl.constexpr, NF: tl.constexpr, DEPTH: tl.constexpr, LIST: tl.constexpr,
                   ALL: tl.constexpr, NPV: tl.constexpr, NARROW: tl.constexpr, ASM: tl.constexpr,
                   DW: tl.constexpr, PDL: tl.constexpr = False):
    grid_dependency(PDL)
    _decide_row(tl.program_id(0), logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
                part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, row_f_ptr, row_i_ptr, out_ptr, path_ptr, work_ptr,
                brk_ptr, lx_ptr, li_ptr, ln_ptr, lb_ptr, n_parts, vocab, FAST_LOG, BLOCK, P, NF, DEPTH, LIST, ALL, NPV,
                NARROW, ASM, DW)


@triton.jit
def _decide_row(i, logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
                part_tok_ptr, part_f_ptr, part_nf_ptr, a1_ptr, row_f_ptr, row_i_ptr, out_ptr, path_ptr, work_ptr,
                brk_ptr, lx_ptr, li_ptr, ln_ptr, lb_ptr, n_parts, vocab, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr,
                P: tl.constexpr, NF: tl.constexpr, DEPTH: tl.constexpr, LIST: tl.constexpr, ALL: tl.constexpr,
                NPV: tl.constexpr, NARROW: tl.constexpr, ASM: tl.constexpr, DW: tl.constexpr):
    """Step 2 for row i: the decide launch's program i or, with ``all_top_p`` and lists
    (FUSE of ``_read1_kernel``), the last read-1 program of the row to finish."""
    row = logits_ptr + i.to(tl.int64) * s_row
    inv_t = tl.load(inv_t_ptr + i)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    first = tl.zeros([], tl.int1)
    if NF:  # read 1 did not draw (the same test as its own)
        first = (inv_t > 0) & _nucleus_first_row(top_k_ptr, top_p_ptr, lmp_ptr, i)
    # a nucleus-first row has no draw to combine (its part tokens are placeholders): column 0 stands in (what
    # the combine gives a row of -inf) until the lists, read 2 or the rounds store its token; leaving the
    # combine out spares the decide a dependent load of the row and the noise of its part tokens
    t = tl.zeros([], tl.int64)
    if not first:
        t = combine_part_tokens(row, part_tok_ptr + i * n_parts, n_parts, inv_t, 0.0, k1, k2, False, FAST_LOG, P)
    state = _DONE
    path = 0
    if inv_t > 0:
        k = tl.load(top_k_ptr + i)
        p = tl.load(top_p_ptr + i)
        lmp = tl.load(lmp_ptr + i)
        offs = tl.arange(0, P)
        ok = offs < n_parts
        mp = tl.load(part_f_ptr + (i * n_parts + offs) * 2, mask=ok, other=-float("inf"))
        zp = tl.load(part_f_ptr + (i * n_parts + offs) * 2 + 1, mask=ok, other=0.0)
        n_fin = tl.sum(tl.load(part_nf_ptr + i * n_parts + offs, mask=ok, other=0), axis=0)
        m = tl.max(mp, axis=0)
        z = tl.sum(tl.where(mp > -float("inf"), zp * tl.exp(mp - m), 0.0), axis=0)
        topk_on = (k > 0) & (k < n_fin)
        if (n_fin > 0) & (topk_on | (p < 1.0) | (lmp > -float("inf"))):
            if (not topk_on) & (lmp == -float("inf")):  # top-p alone
                path = 1
                settled = tl.zeros([], tl.int1)
                if DEPTH > 0:
                    if first:  # the lane lists may hold the nucleus: no read 2
                        at = (i * n_parts).to(tl.int64)
                        tok, settled = nucleus_from_lists(lx_ptr + at * LIST, li_ptr + at * LIST, ln_ptr + at,
                                                          lb_ptr + at, n_parts, m, z, p, k1, k2, FAST_LOG, P, LIST,
                                                          NARROW, ASM, DW)
                        if settled:
                            t = tok
                            path = 8
                if settled:
                    pass
                elif first:
                    path = 7
                    a1 = _lane_maxima(a1_ptr, i, n_parts, BLOCK)
                    floor = lane_floor(a1, m, p * z, BLOCK)
                    has_floor = floor > -float("inf")
                    # mode 2: the tokens >= F (x > the float just under F). No floor (the lanes' mass is
                    # under p Z, rare): mode 1 on the tokens above the smallest lane max, whose mass the
                    # finish tests against p Z (short of it, or too many: the pivot search)
                    lo = tl.where(has_floor, _value(_key(floor) - 1),
                                  tl.min(tl.where(a1 > -float("inf"), a1, float("inf")), axis=0))
                    state = _READ2
                    _send_to_read2(row_f_ptr, row_i_ptr, brk_ptr, i, tl.where(has_floor, 2, 1), m, z, p, lo,
                                   -float("inf"), a1, vocab, BLOCK, NPV)
                else:
                    x_t = tl.load(row + t).to(tl.float32) * inv_t
                    if x_t < m:
                        lo = x_t
                        mode = 1  # the draw is tested: A = mass{x > x_t} against p Z
                        a1 = _lane_maxima(a1_ptr, i, n_parts, BLOCK)
                        floor = lane_floor(a1, m, p * z, BLOCK)
                        if x_t < floor:
                            lo = _value(_key(floor) - 1)  # the float just under F: x > lo <=> x >= F
                            mode = 2  # the draw is out; read 2 gathers the tokens >= F
                        state = _READ2
                        _send_to_read2(row_f_ptr, row_i_ptr, brk_ptr, i, mode, m, z, p, lo, x_t, a1, vocab, BLOCK,
                                       NPV)
            else:
                state = _ONE_PROGRAM
        tl.store(row_i_ptr + i * 4 + 1, n_fin)
    if ALL:  # a row that breaks the promise had no draw: token -1 (path 9), not a wrong token
        if (inv_t <= 0) | (not _nucleus_first_row(top_k_ptr, top_p_ptr, lmp_ptr, i)):
            state = _DONE
            path = 9
            t = tl.full([], -1, tl.int64)
    tl.store(row_i_ptr + i * 4, state)
    tl.store(row_i_ptr + i * 4 + 2, path)
    tl.store(out_ptr + i, t)
    tl.store(path_ptr + i, path)  # (the finish overwrites it for an open row)
    if state != _DONE:  # the row goes on the work list of read 2 and the finish
        tl.store(work_ptr + 4 + tl.atomic_add(work_ptr, 1), i)


def sample_with_cuts_split(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    top_k: torch.Tensor, top_p: torch.Tensor, log_min_p: torch.Tensor, out: torch.Tensor, paths: torch.Tensor,
    split: int, block: int, cap: int, search_block: int, num_pivots: int, num_warps: int,
    nucleus_first: bool = False, marks: list | None = None, lists: int = 0, list_slots: int = 256,
    tile_max: bool = True, all_top_p: bool = False, rounds: int = 2, round_maxnreg: int | None = None,
    decide_warps: int = 0, narrow_draw: bool = True, decide_width: int = 0,
) -> torch.Tensor:
    """The launches of the module docstring for contiguous
    [n, V] logits, n > 0, on a workspace kept between calls (``split_workspace``);
    ``nucleus_first``: top-p-alone rows skip read 1's draw (module docstring); with
    ``lists`` (2 or 3, the lane depth; 0 off) their read 1 also keeps lane lists of
    ``list_slots`` (a power of 2) entries per part, which settle most of them in the
    decide launch (``lane_lists_triton``); ``tile_max`` false: their read 1 keeps no tile
    maxima (no reduction in its loop), and read 2 visits every tile of a row the lists
    did not settle. ``all_top_p`` (with ``nucleus_first``): the caller knows that every row
    is sampled (temperature > 0) with top-p alone, so the launch of read 1 for the other
    rows is left out; a row that is not gets token -1 and path 9. ``rounds`` (0 to
    MAX_ROUNDS): histogram launches after read 2 (0: flat rows take the one-program pivot
    search); ``round_maxnreg``: a register cap for read 2 and the rounds (None: none).
    ``decide_warps``: 0 fuses the decide into read 1 where it can (``all_top_p`` with
    lists: the last program of a row decides it, with read 1's warps); > 0 always runs it
    as a launch of its own, one program of that many warps per row. ``narrow_draw``: the
    decide finishes the lists' draw on ``list_slots`` lanes (``lane_lists_triton``); False:
    on all the row's list slots (session 8's). ``decide_width`` (0 or a power of 2): 0 starts
    the lists' draw on all the row's list slots; W > 0 first moves the entries above T to
    the front and draws on W slots (``lane_lists_triton.nucleus_from_lists``).
    ``marks`` (a list, CUDA): a (launch name, CUDA event) pair is appended after each
    launch, behind a ("start", event) pair, for a per-launch time breakdown."""
    if lists not in (0, 2, 3):
        raise ValueError(f"lists={lists}: the lane depth is 2 or 3 (0: no lists)")
    if all_top_p and not nucleus_first:
        raise ValueError("all_top_p=True needs nucleus_first=True (it leaves out the draw of the other rows)")
    if lists and not nucleus_first:
        raise ValueError(f"lists={lists} needs nucleus_first=True (the lists replace the draw of read 1)")
    if list_slots < 1 or list_slots & (list_slots - 1):
        raise ValueError(f"list_slots={list_slots} must be a power of 2")
    if decide_width < 0 or decide_width & (decide_width - 1):
        raise ValueError(f"decide_width={decide_width}: 0 (all the list slots) or a power of 2")
    if decide_warps not in (0, 1, 2, 4, 8, 16):
        raise ValueError(f"decide_warps={decide_warps}: 0 (fused into read 1) or a power of 2 up to 16")
    if not 0 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds={rounds}: the histogram rounds after read 2 number 0 to {MAX_ROUNDS}")
    if logits.shape[0] > 65535:  # read 1's grid is (parts, rows): CUDA's second grid axis
        raise ValueError(f"{logits.shape[0]} rows: the split sampler takes at most 65,535 rows a call")
    n, vocab = logits.shape
    dev = logits.device
    n_tiles = triton.cdiv(vocab, block)
    split = max(1, min(split, n_tiles))
    part = triton.cdiv(n_tiles, split) * block
    n_parts = triton.cdiv(vocab, part)
    ntp = triton.next_power_of_2(part // block)
    pp = triton.next_power_of_2(max(n_parts, 2))
    inv, sd, pos = inv_temp.float().contiguous(), seeds.contiguous(), positions.contiguous()
    k, p, lmp = top_k.to(torch.int32).contiguous(), top_p.float().contiguous(), log_min_p.float().contiguous()
    list_slots = list_slots if lists else 1
    ws = split_workspace(n, dev, n_parts, block, n_tiles, cap, list_slots)
    try:
        _launch(logits, inv, sd, pos, k, p, lmp, out, paths, ws, vocab, n_tiles, part, n_parts, ntp, pp, cap, block,
                search_block, num_pivots, num_warps, nucleus_first, marks, lists, list_slots, tile_max, all_top_p,
                rounds, round_maxnreg, decide_warps, narrow_draw, decide_width)
    except BaseException:
        discard(ws)
        raise
    return out


def _launch(logits, inv, sd, pos, k, p, lmp, out, paths, ws, vocab, n_tiles, part, n_parts, ntp, pp, cap, block,
            search_block, num_pivots, num_warps, nucleus_first, marks, lists, list_slots, tile_max, all_top_p, rounds,
            round_maxnreg, decide_warps, narrow_draw, decide_width):
    """The launches of ``sample_with_cuts_split`` on its workspace: replayed from the
    workspace's launch plan for this key when it has one (``launch_plan``; LAUNCH_PLANS),
    else issued through ``fast_launch`` (and recorded into a plan)."""
    dev = logits.device
    inputs = (logits, inv, sd, pos, k, p, lmp, out, paths)
    ptrs = [t.data_ptr() for t in inputs]
    asm = ASM_STORES if ASM_STORES is not None else dev.type == "cuda" and not _INTERPRET
    # (not with per-launch events: a launch that starts before the one ahead of it ends would blur them)
    pdl = PDL_LAUNCH and marks is None and pdl_supported(dev)
    # what fixes every launch's specialisation (``fast_launch``): the workspace (its views'
    # alignment follows its rows), shapes, options, and the inputs' dtypes and alignment
    ck = (id(ws), ws.rows, asm, FUSED_MAXNREG, READ1_AHEAD, pdl, logits.dtype, logits.stride(0), vocab, part,
          use_fast_log(dev), block, cap, search_block, num_pivots, num_warps, nucleus_first, lists, list_slots,
          tile_max, all_top_p, rounds, round_maxnreg, decide_warps, narrow_draw, decide_width, chunk_cols(block),
          *(t.dtype for t in (sd, pos, out, paths)), *(a % 16 for a in ptrs))
    planned = (LAUNCH_PLANS and marks is None and fast_launch.ENABLED and dev.type == "cuda" and not _INTERPRET
               and not hooks_set())
    key = (ck, logits.shape[0])
    plan = ws.plans.get(key) if planned else None
    if plan is not None:
        return plan.replay(ptrs, fast_launch._stream())
    with record() if planned else contextlib.nullcontext() as steps:
        n_launches = _issue(ck, asm, pdl, inputs, ws, vocab, n_tiles, part, n_parts, ntp, pp, cap, block,
                            search_block, num_pivots, num_warps, nucleus_first, marks, lists, list_slots, tile_max,
                            all_top_p, rounds, round_maxnreg, decide_warps, narrow_draw, decide_width)
    if planned and len(steps) == n_launches and all(kernel is not None for kernel, _, _ in steps):
        ws.plans[key] = LaunchPlan(steps, inputs)


def _issue(ck, asm, pdl, inputs, ws, vocab, n_tiles, part, n_parts, ntp, pp, cap, block, search_block, num_pivots,
           num_warps, nucleus_first, marks, lists, list_slots, tile_max, all_top_p, rounds, round_maxnreg,
           decide_warps, narrow_draw, decide_width) -> int:
    """The launches through ``fast_launch`` (under the key ck); returns how many were made."""
    logits, inv, sd, pos, k, p, lmp, out, paths = inputs
    n = logits.shape[0]
    dev = logits.device
    part_tok, part_f, part_nf, a_chunks, a1, tmax = ws.part_tok, ws.part_f, ws.part_nf, ws.a_chunks, ws.a1, ws.tmax
    row_f, row_i, n_c, cand_x, cand_i = ws.row_f, ws.row_i, ws.n_c, ws.cand_x, ws.cand_i
    lx, li, ln, lb = ws.lx, ws.li, ws.ln, ws.lb
    fast_log = use_fast_log(dev)
    row_warps = max(num_warps, 4)  # the per-row launches sort and search: not fewer than 4 warps
    pdl_opt = {"launch_pdl": True} if pdl else {}
    s_row = logits.stride(0)
    _mark(marks, "start")
    read1 = [(0, "read1")] if not nucleus_first else [(1, "read1"), (2, "read1_draw")][:1 if all_top_p else 2]
    narrow = list_slots if narrow_draw else 0
    fuse = all_top_p and lists > 0 and not decide_warps  # one read-1 launch, which decides each row at its end
    for rows, name in read1:
        fast(_read1_kernel)[(n_parts, n)](
            logits, s_row, inv, sd, pos, k, p, lmp, part_tok, part_f, part_nf, a1, tmax, lx, li, ln, lb, row_f, row_i,
            out, paths, ws.work[0], ws.brk, ws.ticket, vocab, part, n_parts, n_tiles, FAST_LOG=fast_log, BLOCK=block,
            NTP=ntp, ROWS=rows, DEPTH=lists if rows == 1 else 0, LIST=list_slots, TMAX=tile_max or not lists,
            ALL=all_top_p, FUSE=fuse, P=pp, NPV=HIST_PIVOTS, NARROW=narrow, ASM=asm, DW=decide_width,
            AHEAD=READ1_AHEAD, PDL=pdl, num_warps=num_warps, _key=(ck, rows),
            **({"maxnreg": FUSED_MAXNREG} if fuse else {}), **pdl_opt)
        _mark(marks, name)
    if not fuse:
        fast(_decide_kernel)[(n,)](logits, s_row, inv, sd, pos, k, p, lmp, part_tok, part_f, part_nf, a1, row_f, row_i,
                                   out, paths, ws.work[0], ws.brk, lx, li, ln, lb, n_parts, vocab, FAST_LOG=fast_log,
                                   BLOCK=block, P=pp, NF=nucleus_first, DEPTH=lists, LIST=list_slots, ALL=all_top_p,
                                   NPV=HIST_PIVOTS, NARROW=narrow, ASM=asm, DW=decide_width, PDL=pdl,
                                   num_warps=decide_warps or row_warps, _key=ck, **pdl_opt)
        _mark(marks, "decide")
    n_chunks = a_chunks.shape[1]
    grid = (read2_grid(dev, n, n_chunks),)
    for r in range(rounds + 1):  # read 2, then the histogram rounds (``split_rounds_triton``)
        fast(_round_kernel)[grid](
            logits, s_row, inv, sd, pos, k, p, lmp, row_f, row_i, a1, tmax, n_c, a_chunks, cand_x, cand_i, out, paths,
            ws.brk, ws.hist, ws.work[r], ws.work[min(r + 1, rounds)], ws.ticket, vocab, n_parts, n_tiles, n_chunks,
            FAST_LOG=fast_log, BLOCK=block, CAP=cap, SBLOCK=search_block, NP=num_pivots,
            NCP=triton.next_power_of_2(n_chunks), SCAND=min(64, cap), SCAND2=min(256, cap), CHUNK=chunk_cols(block),
            CT=chunk_cols(block) // block, TMAX=tile_max or not lists, NPV=HIST_PIVOTS,
            FIRST=r == 0, LAST=r == rounds, ASM=asm, OTHER=not all_top_p, PDL=pdl, num_warps=row_warps,
            _key=(ck, r), **({"maxnreg": round_maxnreg} if round_maxnreg else {}), **pdl_opt)
        _mark(marks, "read2" if r == 0 else f"round{r}")
    return len(read1) + (not fuse) + rounds + 1


def _mark(marks: list | None, name: str) -> None:
    if marks is not None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        marks.append((name, ev))
