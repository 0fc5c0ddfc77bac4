"""Scratch of the split cut sampler (``cut_sample_split_triton``), kept between calls.

Allocating the dozen scratch tensors on every call cost the host ~6 us each (H200 image,
session 7: one Sampler call took ~320 us of host time against ~350 us of GPU time), so
they are allocated once per (device, stream, launch shape) for at least the call's rows
and reused; a call with more rows replaces them (rows rounded up to a power of two).
The kernels index rows by their program id, so the buffers are passed whole.

Three of them must hold a known value when a call starts, and the call's own launches put
it back: the candidate counters ``n_c`` (0: read 2 and the gather rounds take slots with
atomic adds), the row tickets ``ticket`` (0: the last read-1 program of a row, with the
fused decide, and the last chunk of a row in read 2 or a round are the ones that count to
the end) and each launch's work list length and finished count ``work[r, :2]`` (0, 0).
The finish of a row resets its n_c, each ticket winner its ticket, the last finish of a
launch that launch's list. A call that fails on the host part-way drops its workspace
(``discard``), so a half-run call never leaves stale values behind.
"""
from __future__ import annotations

import torch
import triton

_CACHE: dict[tuple, "SplitWorkspace"] = {}

# columns of one work item of read 2 (``split_read2_triton``): one load of a chunk
CHUNK_COLS = 2048


# histogram rounds (``split_rounds_triton``): pivots per round (a multiple of 4), at most rounds after read 2
HIST_PIVOTS = 32
MAX_ROUNDS = 3


def chunk_cols(block: int) -> int:
    """Read 2's chunk (a whole number of read 1's tiles of ``block`` columns)."""
    return max(CHUNK_COLS, block)


class SplitWorkspace:
    def __init__(self, rows: int, dev: torch.device, n_parts: int, block: int, n_tiles: int, cap: int, slots: int):
        f32, i32 = torch.float32, torch.int32
        self.rows = rows
        self.part_tok = torch.empty((rows, n_parts), dtype=torch.int64, device=dev)
        self.part_f = torch.empty((rows, n_parts, 2), dtype=f32, device=dev)
        self.part_nf = torch.empty((rows, n_parts), dtype=i32, device=dev)
        n_chunks = triton.cdiv(n_tiles, chunk_cols(block) // block)  # read 2's work items per row
        self.a_chunks = torch.empty((rows, n_chunks), dtype=f32, device=dev)
        self.a1 = torch.empty((rows, n_parts, block), dtype=f32, device=dev)
        self.tmax = torch.empty((rows, n_tiles), dtype=f32, device=dev)
        self.row_f = torch.empty((rows, 4), dtype=f32, device=dev)
        self.row_i = torch.empty((rows, 4), dtype=i32, device=dev)
        self.n_c = torch.zeros(rows, dtype=i32, device=dev)
        self.ticket = torch.zeros(rows, dtype=i32, device=dev)
        # per launch of read 2 and the rounds: [length, rows finished, -, -, row, row, ...] (rows + 4: 16-byte aligned)
        self.work = torch.zeros((MAX_ROUNDS + 1, rows + 4), dtype=i32, device=dev)
        self.brk = torch.empty((rows, HIST_PIVOTS + 4), dtype=f32, device=dev)
        self.hist = torch.empty((rows, n_chunks, 2 * HIST_PIVOTS), dtype=f32, device=dev)
        self.cand_x = torch.empty((rows, cap), dtype=f32, device=dev)
        self.cand_i = torch.empty((rows, cap), dtype=i32, device=dev)
        self.lx = torch.empty((rows, n_parts, slots), dtype=f32, device=dev)
        self.li = torch.empty((rows, n_parts, slots), dtype=i32, device=dev)
        self.ln = torch.empty((rows, n_parts), dtype=i32, device=dev)
        self.lb = torch.empty((rows, n_parts), dtype=f32, device=dev)
        self.plans: dict = {}  # launch plans of the calls on these buffers (``launch_plan``), by their key


def _key(dev: torch.device, *shape: int) -> tuple:
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    return (str(dev), stream, *shape)


def split_workspace(n: int, dev: torch.device, n_parts: int, block: int, n_tiles: int, cap: int,
                    slots: int) -> SplitWorkspace:
    """The workspace for n rows of this launch shape on the current stream of dev. Inside a
    CUDA graph capture a fresh one, not cached (its memory belongs to the graph's pool)."""
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return SplitWorkspace(n, dev, n_parts, block, n_tiles, cap, slots)
    key = _key(dev, n_parts, block, n_tiles, cap, slots, chunk_cols(block))
    ws = _CACHE.get(key)
    if ws is None or ws.rows < n:
        _CACHE.pop(key, None)  # (the old buffers go before the new ones are allocated)
        ws = _CACHE[key] = SplitWorkspace(max(8, triton.next_power_of_2(n)), dev, n_parts, block, n_tiles, cap,
                                          slots)
    return ws


def discard(ws: SplitWorkspace) -> None:
    """Forget a workspace whose call failed part-way (its reset values are unknown)."""
    for key, held in list(_CACHE.items()):
        if held is ws:
            del _CACHE[key]
