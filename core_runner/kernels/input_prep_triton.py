"""Triton twins of the step-input kernels in ``input_prep.py`` and of the staged-write
scatter in ``step_data/buffers.py``.

All three read only device values inside the kernels; every launch is sized from host
ints the caller already has (number of requests, padded number of tokens, number of
staged words), so none of them synchronises and all can be captured in a CUDA graph.

``prepare_inputs_triton``: grid (num_reqs + 1, num_splits). Program (r, s) with
r < num_reqs walks request r's tokens in chunks of BLOCK, taking chunks s, s + S, ...
(S = num_splits, so one long prefill is spread over several programs without the host
knowing any query length), and copies the same share of the request's block-table row.
The last program row (r == num_reqs) fills the padding tokens
[query_start_loc[num_reqs], num_tokens): it reads the end of the real tokens itself.

Defined where the reference would raise: a token whose position is past the token
table gets input id 0, and one whose block index is past the block table gets slot -1;
real tokens past ``num_tokens`` are dropped (never stored out of bounds).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAX_SPLITS = 16


@triton.jit(do_not_specialize=["num_reqs", "num_tokens"])
def _prepare_inputs_kernel(
    idx_ptr, qsl_ptr, computed_ptr, tok_ptr, bt_ptr,
    ids_ptr, pos_ptr, slot_ptr, seq_ptr, bt_out_ptr, logits_ptr,
    num_reqs, num_tokens, max_len, max_blocks,
    tok_stride, bt_stride, bt_out_stride,
    KV_BLOCK: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    req = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    lanes = tl.arange(0, BLOCK)
    if req < num_reqs:
        row = tl.load(idx_ptr + req).to(tl.int64)
        start = tl.load(qsl_ptr + req).to(tl.int32)
        end = tl.load(qsl_ptr + req + 1).to(tl.int32)
        computed = tl.load(computed_ptr + row).to(tl.int64)
        q_len = end - start
        if split == 0:
            tl.store(seq_ptr + req, (computed + q_len).to(tl.int32))
            tl.store(logits_ptr + req, tl.maximum(end - 1, 0).to(tl.int64))
        tok_row = tok_ptr + row * tok_stride
        bt_row = bt_ptr + row * bt_stride
        for first in range(split * BLOCK, q_len, num_splits * BLOCK):
            i = first + lanes
            t = start + i
            live = (i < q_len) & (t < num_tokens)
            pos = computed + i
            ids = tl.load(tok_row + pos, mask=live & (pos < max_len), other=0)
            col = pos // KV_BLOCK
            has_block = live & (col < max_blocks)
            blk = tl.load(bt_row + col, mask=has_block, other=0).to(tl.int64)
            slot = tl.where(has_block, blk * KV_BLOCK + pos % KV_BLOCK, -1)
            tl.store(ids_ptr + t, ids.to(tl.int32), mask=live)
            tl.store(pos_ptr + t, pos, mask=live)
            tl.store(slot_ptr + t, slot, mask=live)
        out_row = bt_out_ptr + req.to(tl.int64) * bt_out_stride
        cols = tl.arange(0, BLOCK_COLS)
        for c0 in range(split * BLOCK_COLS, max_blocks, num_splits * BLOCK_COLS):
            c = c0 + cols
            m = c < max_blocks
            v = tl.load(bt_row + c, mask=m)
            tl.store(out_row + c, v.to(bt_out_ptr.dtype.element_ty), mask=m)
    else:
        total = tl.load(qsl_ptr + num_reqs).to(tl.int32)
        for first in range(total + split * BLOCK, num_tokens, num_splits * BLOCK):
            t = first + lanes
            m = t < num_tokens
            tl.store(ids_ptr + t, tl.zeros([BLOCK], dtype=tl.int32), mask=m)
            tl.store(pos_ptr + t, tl.zeros([BLOCK], dtype=tl.int64), mask=m)
            tl.store(slot_ptr + t, tl.full([BLOCK], -1, dtype=tl.int64), mask=m)


def _out_buffer(out: dict | None, key: str, shape: tuple[int, ...], dtype: torch.dtype,
                device: torch.device) -> torch.Tensor:
    """A preallocated buffer from ``out`` (checked, sliced to ``shape``) or a new one."""
    buf = None if out is None else out.get(key)
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if buf.dtype != dtype or buf.device != device or buf.dim() != len(shape):
        raise ValueError(f"out[{key!r}] must be a {len(shape)}-D {dtype} tensor on {device}, "
                         f"got {buf.dim()}-D {buf.dtype} on {buf.device}")
    if any(have < need for have, need in zip(buf.shape, shape)):
        raise ValueError(f"out[{key!r}] has shape {tuple(buf.shape)}, needs at least {shape}")
    view = buf[: shape[0]] if len(shape) == 1 else buf[: shape[0], : shape[1]]
    if view.stride(-1) != 1:
        raise ValueError(f"out[{key!r}] must be contiguous in its last dimension")
    return view


def prepare_inputs_triton(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed: torch.Tensor,
    token_ids: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    num_tokens: int,
    out: dict[str, torch.Tensor] | None = None,
    *,
    block_tokens: int = 256,
) -> dict[str, torch.Tensor]:
    """Same result as ``prepare_inputs_ref`` in one launch, with no host read.

    idx_mapping [num_reqs] int32/int64 state rows; query_start_loc [num_reqs + 1];
    num_computed [num_rows]; token_ids [num_rows, max_len] (a device tensor, or on
    CUDA a pinned host tensor, read through unified addressing); block_table
    [num_rows, max_blocks]. ``out`` may hold preallocated buffers (any subset of
    input_ids, positions, slot_mapping [>= num_tokens]; seq_lens, logits_indices
    [>= num_reqs]; block_tables [>= num_reqs, >= max_blocks]) that are filled in place;
    the dict returned holds views of them sliced to this step's sizes.
    ``block_tokens`` (a power of two) is the chunk one program handles per iteration.
    """
    if idx_mapping.dim() != 1 or query_start_loc.dim() != 1:
        raise ValueError("idx_mapping and query_start_loc must be 1-D")
    num_reqs = idx_mapping.shape[0]
    if query_start_loc.shape[0] != num_reqs + 1:
        raise ValueError(f"query_start_loc has {query_start_loc.shape[0]} entries for {num_reqs} requests")
    if token_ids.dim() != 2 or block_table.dim() != 2:
        raise ValueError("token_ids and block_table must be 2-D [rows, columns]")
    if token_ids.stride(1) != 1 or block_table.stride(1) != 1:
        raise ValueError("token_ids and block_table rows must be contiguous")
    if block_size < 1 or num_tokens < 0:
        raise ValueError(f"bad block_size={block_size} / num_tokens={num_tokens}")
    if block_tokens < 1 or block_tokens & (block_tokens - 1):
        raise ValueError(f"block_tokens must be a power of two, got {block_tokens}")
    device = idx_mapping.device
    max_blocks = block_table.shape[1]
    input_ids = _out_buffer(out, "input_ids", (num_tokens,), torch.int32, device)
    positions = _out_buffer(out, "positions", (num_tokens,), torch.int64, device)
    slot_mapping = _out_buffer(out, "slot_mapping", (num_tokens,), torch.int64, device)
    seq_lens = _out_buffer(out, "seq_lens", (num_reqs,), torch.int32, device)
    block_tables = _out_buffer(out, "block_tables", (num_reqs, max_blocks), block_table.dtype, device)
    logits_indices = _out_buffer(out, "logits_indices", (num_reqs,), torch.int64, device)
    idx_mapping = idx_mapping.contiguous()
    query_start_loc = query_start_loc.contiguous()
    num_computed = num_computed.contiguous()
    num_splits = max(1, min(triton.cdiv(max(num_tokens, max_blocks), block_tokens), _MAX_SPLITS))
    block_cols = max(16, min(triton.next_power_of_2(max(max_blocks, 1)), 1024))
    grid = (num_reqs + 1, num_splits)
    _prepare_inputs_kernel[grid](
        idx_mapping, query_start_loc, num_computed, token_ids, block_table,
        input_ids, positions, slot_mapping, seq_lens, block_tables, logits_indices,
        num_reqs, num_tokens, token_ids.shape[1], max_blocks,
        token_ids.stride(0), block_table.stride(0), block_tables.stride(0),
        KV_BLOCK=block_size, BLOCK=block_tokens, BLOCK_COLS=block_cols,
        num_warps=4,
    )
    return {
        "input_ids": input_ids,
        "positions": positions,
        "seq_lens": seq_lens,
        "slot_mapping": slot_mapping,
        "block_tables": block_tables,
        "logits_indices": logits_indices,
    }


@triton.jit
def _post_update_kernel(
    idx_ptr, sched_ptr, sampled_ptr, computed_ptr, ntok_ptr, tok_ptr,
    sampled_stride, tok_stride, max_len,
):
    req = tl.program_id(0)
    row = tl.load(idx_ptr + req).to(tl.int64)
    computed = tl.load(computed_ptr + row)
    n_tok = tl.load(ntok_ptr + row)
    new_computed = computed + tl.load(sched_ptr + req).to(computed_ptr.dtype.element_ty)
    done = (new_computed >= n_tok) & (n_tok < max_len)
    token = tl.load(sampled_ptr + req.to(tl.int64) * sampled_stride)
    # where not done, n_tok may be past the row: the store is masked off
    tl.store(tok_ptr + row * tok_stride + n_tok, token.to(tok_ptr.dtype.element_ty), mask=done)
    tl.store(ntok_ptr + row, n_tok + done.to(ntok_ptr.dtype.element_ty))
    tl.store(computed_ptr + row, new_computed)


def post_update_triton(
    idx_mapping: torch.Tensor,
    num_scheduled: torch.Tensor,
    sampled: torch.Tensor,
    num_computed: torch.Tensor,
    num_tokens: torch.Tensor,
    token_ids: torch.Tensor,
) -> None:
    """``post_update_ref`` in one launch, one program per request (in place).

    idx_mapping [num_reqs] rows (distinct); num_scheduled [num_reqs] query lengths;
    sampled [num_reqs] token ids; num_computed, num_tokens [num_rows] (updated);
    token_ids [num_rows, max_len] (device, or pinned host on CUDA; appended to)."""
    num_reqs = idx_mapping.shape[0]
    if num_scheduled.shape[0] != num_reqs or sampled.dim() != 1 or sampled.shape[0] != num_reqs:
        raise ValueError("num_scheduled and sampled must be 1-D with one entry per request")
    if num_computed.dim() != 1 or num_tokens.dim() != 1 or token_ids.dim() != 2 or token_ids.stride(1) != 1:
        raise ValueError("num_computed/num_tokens must be 1-D and token_ids 2-D with contiguous rows")
    if num_computed.stride(0) != 1 or num_tokens.stride(0) != 1:
        raise ValueError("num_computed and num_tokens must be contiguous (updated in place)")
    if num_reqs == 0:
        return
    _post_update_kernel[(num_reqs,)](
        idx_mapping.contiguous(), num_scheduled.contiguous(), sampled, num_computed, num_tokens, token_ids,
        sampled.stride(0), token_ids.stride(0), token_ids.shape[1],
        num_warps=1,
    )


# how the int64 value words become table elements
_INT, _F32_BITS, _F64_BITS = 0, 1, 2
_WORD_KIND = {
    torch.int32: _INT, torch.int64: _INT,
    torch.float32: _F32_BITS, torch.float64: _F64_BITS,
}


@triton.jit(do_not_specialize=["n"])
def _staged_scatter_kernel(table_ptr, packed_ptr, n, table_stride, KIND: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    idx = tl.load(packed_ptr + offs, mask=m, other=0)
    word = tl.load(packed_ptr + n + offs, mask=m, other=0)
    if KIND == 1:
        val = word.to(tl.int32).to(tl.float32, bitcast=True)
    elif KIND == 2:
        val = word.to(tl.float64, bitcast=True)
    else:
        val = word.to(table_ptr.dtype.element_ty)
    tl.store(table_ptr + idx * table_stride, val, mask=m)


def apply_staged_writes_triton(table_flat: torch.Tensor, packed: torch.Tensor, n: int) -> None:
    """Scatter for ``StagedWriteTensor``: ``packed`` is int64 [2n] = [flat indices | value
    words]; writes each word, as the table's dtype, at its index of ``table_flat`` (1-D:
    the table viewed flat). int32/int64 tables take the word's value (int32 truncates, as
    ``.to(torch.int32)`` does); float32 reinterprets the word's low 32 bits, float64 all 64.
    Indices should be distinct (as for ``index_copy_``, duplicates leave either value)."""
    if table_flat.dim() != 1:
        raise ValueError(f"table_flat must be 1-D (the table viewed flat), got shape {tuple(table_flat.shape)}")
    kind = _WORD_KIND.get(table_flat.dtype)
    if kind is None:
        raise ValueError(f"staged writes support int32/int64/float32/float64 tables, not {table_flat.dtype}")
    if packed.dtype != torch.int64 or packed.dim() != 1 or packed.shape[0] < 2 * n:
        raise ValueError(f"packed must be 1-D int64 with at least 2n={2 * n} words")
    if n <= 0:
        return
    block = 1024
    _staged_scatter_kernel[(triton.cdiv(n, block),)](
        table_flat, packed.contiguous(), n, table_flat.stride(0), KIND=kind, BLOCK=block, num_warps=4,
    )
