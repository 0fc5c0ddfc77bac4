"""Read 2 of the split cut sampler (``cut_sample_split_triton``, step 3) and its finish,
one launch over the rows the decide left open.

The decide appends each open row to a work list (``work[4:]``, its length in ``work[0]``),
so read 2 does not start a program per row and part to find most rows done: it runs a
fixed grid of programs (a few per SM) over the work items (list row, chunk of CHUNK
columns). A chunk of a row in state ``_READ2`` is one load of CHUNK tokens: the mass of
its tokens > lo (stored per chunk, summed in chunk order by the finish) and those tokens
as the row's candidates (slots taken with one atomic add per chunk; the finish sorts
them, so their order does not matter). Small chunks spread the handful of rows the lane
lists miss over many programs: session 7's read 2, two passes of each row's parts on its
8 programs, was latency-bound at ~0.04 ms for 6 rows (H200).

The last chunk of a row to finish (a ticket per row, acquire-release, as read 1's fused
decide) runs the row's finish (``split_finish_triton``); a row in state ``_ONE_PROGRAM``
(other cuts) is finished by its chunk 0 with no read. The last row to finish puts the
list's length and its own counter (``work[1]``) back to 0 for the next call.
"""
from __future__ import annotations

import triton
import triton.language as tl

from core_runner.kernels.grid_dependency import grid_dependency
from core_runner.kernels.gumbel_sample import row_keys
from core_runner.kernels.scatter_store import scatter_store
from core_runner.kernels.split_finish_triton import _ONE_PROGRAM, _finish_round, _finish_row
from core_runner.kernels.split_rounds_triton import _SEARCH, gather_chunk, hist_chunk


@triton.jit
def _read2_chunk(row, i, c, inv_t, m, lo_v, tmax_ptr, nc_ptr, chunk_a_ptr, cx_ptr, ci_ptr, vocab, n_tiles,
                 n_chunks, CAP: tl.constexpr, CHUNK: tl.constexpr, CT: tl.constexpr, TMAX: tl.constexpr,
                 ASM: tl.constexpr):
    """Chunk c of row i: mass{x > lo_v} into its slot of chunk_a, the tokens > lo_v into
    the row's candidates. With TMAX (read 1 kept tile maxima) a chunk whose tiles all have
    their max <= lo_v is not read."""
    read = True
    if TMAX:
        tiles = c * CT + tl.arange(0, CT)
        read = tl.max(tl.load(tmax_ptr + i.to(tl.int64) * n_tiles + tiles, mask=tiles < n_tiles,
                              other=-float("inf")), axis=0) > lo_v
    a = tl.zeros([], tl.float32)
    if read:
        cols = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
        gt = x > lo_v
        a = tl.sum(tl.where(gt, tl.exp(x - m), 0.0), axis=0)
        cnt = tl.sum(gt.to(tl.int32), axis=0)
        if cnt > 0:
            at = tl.atomic_add(nc_ptr + i, cnt) + tl.cumsum(gt.to(tl.int32), axis=0) - 1
            scatter_store(cx_ptr + i.to(tl.int64) * CAP + at, x, gt & (at < CAP), ASM)
            scatter_store(ci_ptr + i.to(tl.int64) * CAP + at, cols, gt & (at < CAP), ASM)
    tl.store(chunk_a_ptr + i * n_chunks + c, a)


@triton.jit
def _round_kernel(logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr, row_f_ptr,
                  row_i_ptr, a1_ptr, tmax_ptr, nc_ptr, chunk_a_ptr, cx_ptr, ci_ptr, out_ptr, path_ptr, brk_ptr,
                  hist_ptr, work_ptr, next_ptr, ticket_ptr, vocab, n_parts, n_tiles, n_chunks,
                  FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, SBLOCK: tl.constexpr,
                  NP: tl.constexpr, NCP: tl.constexpr, SCAND: tl.constexpr, SCAND2: tl.constexpr,
                  CHUNK: tl.constexpr, CT: tl.constexpr, TMAX: tl.constexpr, NPV: tl.constexpr,
                  FIRST: tl.constexpr, LAST: tl.constexpr, ASM: tl.constexpr, OTHER: tl.constexpr,
                  PDL: tl.constexpr = False):
    """Program q of the fixed grid takes the work items q, q + grid, ... of its list
    (module docstring). FIRST: read 2 (rows ``_READ2``, ``_ONE_PROGRAM``); else a
    histogram round (rows ``_SEARCH``, ``_GATHER``: ``split_rounds_triton``). Rows that
    go on are put on next_ptr's list; LAST: none (a row still searching takes the
    one-program search). OTHER: rows with other cuts (state ``_ONE_PROGRAM``) may be on
    the list (False with ``all_top_p``: their path is not compiled). PDL: launched as a
    programmatic dependent launch (``grid_dependency``)."""
    grid_dependency(PDL)
    n_rows = tl.load(work_ptr)
    for w in range(tl.program_id(0), n_rows * n_chunks, tl.num_programs(0)):
        r = w // n_chunks
        c = w - r * n_chunks
        i = tl.load(work_ptr + 4 + r)
        state = tl.load(row_i_ptr + i * 4)
        last = (c == 0) & (state == _ONE_PROGRAM)
        if state != _ONE_PROGRAM:
            row = logits_ptr + i.to(tl.int64) * s_row
            inv_t = tl.load(inv_t_ptr + i)
            m = tl.load(row_f_ptr + i * 4)
            b = brk_ptr + i * (NPV + 4)
            h = hist_ptr + (i * n_chunks + c).to(tl.int64) * (2 * NPV)
            if FIRST:
                _read2_chunk(row, i, c, inv_t, m, tl.load(row_f_ptr + i * 4 + 2), tmax_ptr, nc_ptr, chunk_a_ptr,
                             cx_ptr, ci_ptr, vocab, n_tiles, n_chunks, CAP, CHUNK, CT, TMAX, ASM)
                if not LAST:  # the first histogram, for a row flagged flat by the decide
                    if tl.load(b + 3) != 0:
                        hist_chunk(row, c, inv_t, m, b, h, vocab, CHUNK, NPV)
            elif state == _SEARCH:
                hist_chunk(row, c, inv_t, m, b, h, vocab, CHUNK, NPV)
            else:
                k1, k2 = row_keys(seed_ptr, pos_ptr, i)
                gather_chunk(row, i, c, inv_t, k1, k2, b, h, nc_ptr, cx_ptr, ci_ptr, vocab, FAST_LOG, CAP, CHUNK, ASM)
            tl.debug_barrier()  # every thread's stores of this chunk before the ticket
            last = tl.atomic_add(ticket_ptr + i, 1, sem="acq_rel") == n_chunks - 1
        if last:
            tl.store(ticket_ptr + i, 0)
            if FIRST:
                _finish_row(i, logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
                            row_f_ptr, row_i_ptr, a1_ptr, nc_ptr, chunk_a_ptr, cx_ptr, ci_ptr, out_ptr, path_ptr,
                            brk_ptr, hist_ptr, next_ptr, vocab, n_parts, n_chunks, FAST_LOG, BLOCK, CAP, SBLOCK, NP,
                            NCP, SCAND, SCAND2, NPV, not LAST, OTHER)
            else:
                _finish_round(i, logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
                              row_f_ptr, row_i_ptr, nc_ptr, cx_ptr, ci_ptr, out_ptr, path_ptr, brk_ptr, hist_ptr,
                              next_ptr, vocab, n_chunks, FAST_LOG, BLOCK, CAP, SBLOCK, NP, NCP, SCAND2, NPV, LAST)
            tl.debug_barrier()
            if tl.atomic_add(work_ptr + 1, 1, sem="acq_rel") == n_rows - 1:
                tl.store(work_ptr, 0)
                tl.store(work_ptr + 1, 0)


def read2_grid(dev, n_rows: int, n_chunks: int) -> int:
    """The fixed grid of read 2: 4 programs per SM on a GPU (at most one per work item of
    the largest list), 2 programs on the CPU interpreter (which runs them one by one)."""
    if dev.type != "cuda":
        return 2
    return max(1, min(n_rows * n_chunks, 4 * _sm_count(dev.index if dev.index is not None else 0)))


_SMS: dict[int, int] = {}


def _sm_count(index: int) -> int:
    if index not in _SMS:
        import torch

        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]
