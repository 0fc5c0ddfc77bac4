"""Triton input-prep, post-update and staged-write kernels against their torch references.

On a CPU-only machine the ``device`` fixture (tests/kernels/conftest.py) is "cpu" and
TRITON_INTERPRET=1 runs the kernels in Triton's interpreter; with CUDA it is "cuda".
The tests marked ``gpu`` need CUDA: pinned host token table, CUDA-graph capture and
``set_sync_debug_mode("error")``.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():  # conftest does this too; kept so the file stands alone
    os.environ.setdefault("TRITON_INTERPRET", "1")

from core_runner.kernels.input_prep import post_update_ref, prepare_inputs_ref  # noqa: E402
from core_runner.kernels.input_prep_triton import (  # noqa: E402
    apply_staged_writes_triton,
    post_update_triton,
    prepare_inputs_triton,
)
from core_runner.step_data.buffers import StagedWriteTensor  # noqa: E402

KEYS = ("input_ids", "positions", "seq_lens", "slot_mapping", "block_tables", "logits_indices")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# ---- helpers ------------------------------------------------------------------------
def _state(g, num_rows, max_len, block_size, extra_cols=1):
    """Token table, block table (distinct block ids) and num_computed for num_rows rows."""
    max_blocks = -(-max_len // block_size) + extra_cols
    token_ids = torch.randint(1, 50_000, (num_rows, max_len), generator=g, dtype=torch.int32)
    block_table = torch.randperm(num_rows * max_blocks * 3, generator=g)[: num_rows * max_blocks]
    block_table = block_table.to(torch.int32).view(num_rows, max_blocks)
    return token_ids, block_table


def _batch(g, num_rows, max_len, max_reqs, max_prefill):
    """A mixed batch: rows in random order (a permutation of a subset of the rows),
    decode rows of one token and prefill chunks, most starting at a nonzero
    num_computed. Returns idx_mapping, query_start_loc, num_computed, kinds."""
    num_reqs = int(torch.randint(2, max_reqs + 1, (1,), generator=g))
    rows = torch.randperm(num_rows, generator=g)[:num_reqs]
    num_computed = torch.randint(0, max_len, (num_rows,), generator=g, dtype=torch.int32)
    q_lens, kinds = [], []
    for i, row in enumerate(rows.tolist()):
        # force one decode row and one prefill row; the rest at random
        if i < 2:
            kind = ("decode", "prefill")[i]
        else:
            kind = ("decode", "prefill")[int(torch.randint(0, 2, (1,), generator=g))]
        if kind == "decode":
            q = 1
            num_computed[row] = int(torch.randint(0, max_len, (1,), generator=g))
        else:
            start = int(torch.randint(0, max_len // 2, (1,), generator=g)) if i != 1 else max_len // 3
            q = int(torch.randint(2, min(max_prefill, max_len - start) + 1, (1,), generator=g))
            num_computed[row] = start
        q_lens.append(q)
        kinds.append(kind)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    return rows.to(torch.int32), qsl, num_computed, kinds


def _assert_same(got, expected):
    assert set(got) >= set(KEYS)
    for k in KEYS:
        assert got[k].dtype == expected[k].dtype, (k, got[k].dtype, expected[k].dtype)
        assert got[k].shape == expected[k].shape, (k, tuple(got[k].shape), tuple(expected[k].shape))
        assert torch.equal(got[k].cpu(), expected[k].cpu()), (k, got[k].cpu(), expected[k].cpu())


def _to(device, *ts):
    return [t.to(device) for t in ts]


# ---- prepare_inputs -----------------------------------------------------------------
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed,pad,block_tokens", [(0, 0, 256), (1, 7, 256), (2, 13, 8)])
def test_prepare_matches_reference(device, block_size, seed, pad, block_tokens):
    g = torch.Generator().manual_seed(seed * 100 + block_size)
    num_rows, max_len = 10, 80
    token_ids, block_table = _state(g, num_rows, max_len, block_size)
    idx, qsl, num_computed, kinds = _batch(g, num_rows, max_len, max_reqs=7, max_prefill=40)
    assert "decode" in kinds and "prefill" in kinds
    assert int(num_computed[idx[1]]) > 0  # a prefill chunk that starts mid-prompt
    total = int(qsl[-1])
    num_tokens = total + pad
    idx, qsl, num_computed, token_ids, block_table = _to(device, idx, qsl, num_computed, token_ids, block_table)
    expected = prepare_inputs_ref(idx, qsl, num_computed, token_ids, block_table, block_size, num_tokens)
    got = prepare_inputs_triton(idx, qsl, num_computed, token_ids, block_table, block_size, num_tokens,
                                block_tokens=block_tokens)
    _assert_same(got, expected)
    # the comparison is not vacuous: real tokens carry real ids and slots, padding does not
    assert bool((expected["input_ids"][:total] > 0).all())
    assert bool((expected["slot_mapping"][:total] >= 0).all())
    assert bool((got["slot_mapping"][total:] == -1).all()) and got["slot_mapping"].shape[0] == num_tokens


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_prepare_idx_dtype_and_int64_num_computed(device, idx_dtype):
    g = torch.Generator().manual_seed(7)
    token_ids, block_table = _state(g, 9, 48, 4)
    idx, qsl, num_computed, _ = _batch(g, 9, 48, max_reqs=6, max_prefill=20)
    num_tokens = int(qsl[-1]) + 3
    idx, qsl, num_computed, token_ids, block_table = _to(
        device, idx.to(idx_dtype), qsl, num_computed.long(), token_ids, block_table)
    expected = prepare_inputs_ref(idx, qsl, num_computed, token_ids, block_table, 4, num_tokens)
    got = prepare_inputs_triton(idx, qsl, num_computed, token_ids, block_table, 4, num_tokens)
    _assert_same(got, expected)


def test_prepare_long_prefill_over_many_chunks(device):
    """One long prefill chunk next to decodes: many programs split its tokens, each
    looping over several chunks (block_tokens=8), and the block-table copy is split too."""
    g = torch.Generator().manual_seed(3)
    num_rows, max_len, block_size = 6, 512, 4
    token_ids, block_table = _state(g, num_rows, max_len, block_size, extra_cols=3)
    num_computed = torch.randint(0, 100, (num_rows,), generator=g, dtype=torch.int32)
    num_computed[4] = 37
    idx = torch.tensor([2, 4, 0], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 1 + 400, 1 + 400 + 1], dtype=torch.int32)
    num_tokens = 420
    idx, qsl, num_computed, token_ids, block_table = _to(device, idx, qsl, num_computed, token_ids, block_table)
    expected = prepare_inputs_ref(idx, qsl, num_computed, token_ids, block_table, block_size, num_tokens)
    for block_tokens in (8, 256):
        got = prepare_inputs_triton(idx, qsl, num_computed, token_ids, block_table, block_size, num_tokens,
                                    block_tokens=block_tokens)
        _assert_same(got, expected)


def test_prepare_wide_block_table(device):
    """block_size 1 and a long row: the block-table gather needs several column chunks."""
    g = torch.Generator().manual_seed(9)
    num_rows, max_len, block_size = 4, 1500, 1
    token_ids, block_table = _state(g, num_rows, max_len, block_size)
    assert block_table.shape[1] > 1024
    num_computed = torch.tensor([1400, 3, 1200, 0], dtype=torch.int32)
    idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2, 30], dtype=torch.int32)
    args = _to(device, idx, qsl, num_computed, token_ids, block_table)
    _assert_same(prepare_inputs_triton(*args, block_size, 34), prepare_inputs_ref(*args, block_size, 34))


def test_prepare_empty_requests(device):
    """Requests with no token this step (as padded batches have), first, inside and last:
    logits index clamps at 0, seq_len is num_computed, no token written for them."""
    g = torch.Generator().manual_seed(10)
    token_ids, block_table = _state(g, 8, 40, 4)
    num_computed = torch.randint(1, 20, (8,), generator=g, dtype=torch.int32)
    idx = torch.tensor([5, 1, 6, 2, 7], dtype=torch.int32)
    qsl = torch.tensor([0, 0, 1, 1, 12, 12], dtype=torch.int32)
    args = _to(device, idx, qsl, num_computed, token_ids, block_table)
    expected = prepare_inputs_ref(*args, 4, 16)
    assert int(expected["logits_indices"][0]) == 0
    _assert_same(prepare_inputs_triton(*args, 4, 16), expected)


def test_prepare_fills_out_buffers_in_place(device):
    """Into dirty, oversized buffers: returns views of them, writes exactly the step's
    prefix (padding included, although the host never says where padding starts)."""
    g = torch.Generator().manual_seed(11)
    num_rows, max_len, block_size = 10, 64, 4
    token_ids, block_table = _state(g, num_rows, max_len, block_size)
    cap_tokens, cap_reqs = 256, 12
    max_blocks = block_table.shape[1]
    out = {
        "input_ids": torch.full((cap_tokens,), 777, dtype=torch.int32),
        "positions": torch.full((cap_tokens,), 777, dtype=torch.int64),
        "slot_mapping": torch.full((cap_tokens,), 777, dtype=torch.int64),
        "seq_lens": torch.full((cap_reqs,), 777, dtype=torch.int32),
        "block_tables": torch.full((cap_reqs, max_blocks + 2), 777, dtype=torch.int32),
        "logits_indices": torch.full((cap_reqs,), 777, dtype=torch.int64),
    }
    out = {k: v.to(device) for k, v in out.items()}
    token_ids, block_table = _to(device, token_ids, block_table)
    sizes = []
    for step in range(2):  # the second, smaller step must overwrite the first's tokens with padding
        idx, qsl, num_computed, _ = _batch(g, num_rows, max_len, max_reqs=[8, 3][step], max_prefill=[30, 8][step])
        num_tokens = int(qsl[-1]) + [5, 9][step]
        if step == 1:  # this step's padding covers real tokens of the previous one
            assert sizes[0][0] - 5 > num_tokens
        idx, qsl, num_computed = _to(device, idx, qsl, num_computed)
        expected = prepare_inputs_ref(idx, qsl, num_computed, token_ids, block_table, block_size, num_tokens)
        got = prepare_inputs_triton(idx, qsl, num_computed, token_ids, block_table, block_size, num_tokens, out=out)
        _assert_same(got, expected)
        for k in KEYS:
            assert got[k].data_ptr() == out[k].data_ptr(), k
        sizes.append((num_tokens, idx.shape[0]))
    num_tokens = max(n for n, _ in sizes)
    num_reqs = max(r for _, r in sizes)
    for k in ("input_ids", "positions", "slot_mapping"):
        assert bool((out[k][num_tokens:] == 777).all()), k
    for k in ("seq_lens", "logits_indices"):
        assert bool((out[k][num_reqs:] == 777).all()), k
    assert bool((out["block_tables"][:, max_blocks:] == 777).all())
    assert bool((out["block_tables"][num_reqs:] == 777).all())


def test_prepare_only_padding(device):
    """No request at all (num_reqs = 0): every token is padding."""
    token_ids, block_table = _state(torch.Generator().manual_seed(5), 4, 16, 4)
    idx = torch.zeros(0, dtype=torch.int32)
    qsl = torch.zeros(1, dtype=torch.int32)
    num_computed = torch.zeros(4, dtype=torch.int32)
    args = _to(device, idx, qsl, num_computed, token_ids, block_table)
    expected = prepare_inputs_ref(*args, 4, 5)
    out = {"input_ids": torch.full((8,), 9, dtype=torch.int32, device=device)}
    got = prepare_inputs_triton(*args, 4, 5, out=out)
    _assert_same(got, expected)
    assert bool((out["input_ids"][5:] == 9).all())


def test_prepare_rejects_bad_out_buffer(device):
    token_ids, block_table = _state(torch.Generator().manual_seed(5), 4, 16, 4)
    idx = torch.tensor([1], dtype=torch.int32)
    qsl = torch.tensor([0, 2], dtype=torch.int32)
    args = _to(device, idx, qsl, torch.zeros(4, dtype=torch.int32), token_ids, block_table)
    with pytest.raises(ValueError):
        prepare_inputs_triton(*args, 4, 4, out={"positions": torch.zeros(4, dtype=torch.int32, device=device)})
    with pytest.raises(ValueError):
        prepare_inputs_triton(*args, 4, 4, out={"input_ids": torch.zeros(3, dtype=torch.int32, device=device)})


# ---- post_update --------------------------------------------------------------------
def _post_update_case(g, num_rows, max_len, num_reqs):
    """States covering: decode (appends), partial prefill chunk (no append), last prefill
    chunk (appends), full row (num_tokens == max_len: no append, still advances)."""
    token_ids = torch.randint(0, 1000, (num_rows, max_len), generator=g, dtype=torch.int32)
    num_tokens = torch.randint(1, max_len, (num_rows,), generator=g, dtype=torch.int32)
    num_computed = torch.zeros(num_rows, dtype=torch.int32)
    rows = torch.randperm(num_rows, generator=g)[:num_reqs]
    sched = []
    for i, row in enumerate(rows.tolist()):
        n = int(num_tokens[row])
        kind = i % 4 if i < 4 else int(torch.randint(0, 4, (1,), generator=g))
        if kind == 0:  # decode
            num_computed[row] = n - 1
            sched.append(1)
        elif kind == 1:  # partial prefill chunk
            num_tokens[row] = max(n, 3)
            start = int(torch.randint(0, int(num_tokens[row]) - 2, (1,), generator=g))
            num_computed[row] = start
            sched.append(int(torch.randint(1, int(num_tokens[row]) - start, (1,), generator=g)))
        elif kind == 2:  # last prefill chunk
            start = int(torch.randint(0, n, (1,), generator=g))
            num_computed[row] = start
            sched.append(n - start)
        else:  # row already full
            num_tokens[row] = max_len
            num_computed[row] = max_len - 1
            sched.append(1)
    sampled = torch.randint(50_000, 60_000, (num_reqs,), generator=g, dtype=torch.int64)
    return rows.to(torch.int32), torch.tensor(sched, dtype=torch.int32), sampled, num_computed, num_tokens, token_ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_post_update_matches_reference(device, seed):
    g = torch.Generator().manual_seed(seed)
    case = _to(device, *_post_update_case(g, num_rows=12, max_len=24, num_reqs=9))
    idx, sched, sampled, num_computed, num_tokens, token_ids = case
    ref_state = [num_computed.clone(), num_tokens.clone(), token_ids.clone()]
    post_update_ref(idx, sched, sampled, *ref_state)
    before_tokens = num_tokens.clone()
    post_update_triton(idx, sched, sampled, num_computed, num_tokens, token_ids)
    assert torch.equal(num_computed.cpu(), ref_state[0].cpu())
    assert torch.equal(num_tokens.cpu(), ref_state[1].cpu())
    assert torch.equal(token_ids.cpu(), ref_state[2].cpu())
    appended = int((num_tokens != before_tokens).sum())
    assert 0 < appended < idx.shape[0]  # some rows appended, some did not
    # and the appended tokens are the sampled ones
    assert int((token_ids >= 50_000).sum()) == appended


def test_post_update_int64_tables(device):
    g = torch.Generator().manual_seed(4)
    idx, sched, sampled, num_computed, num_tokens, token_ids = _post_update_case(g, 8, 16, 6)
    case = _to(device, idx.long(), sched, sampled.int(), num_computed.long(), num_tokens.long(), token_ids.long())
    idx, sched, sampled, num_computed, num_tokens, token_ids = case
    ref_state = [num_computed.clone(), num_tokens.clone(), token_ids.clone()]
    post_update_ref(idx, sched, sampled, *ref_state)
    post_update_triton(idx, sched, sampled, num_computed, num_tokens, token_ids)
    for got, exp in zip((num_computed, num_tokens, token_ids), ref_state):
        assert got.dtype == exp.dtype and torch.equal(got.cpu(), exp.cpu())


# ---- staged writes ------------------------------------------------------------------
def _words(values: torch.Tensor) -> torch.Tensor:
    """The packed value words, built independently of buffers.py."""
    if values.dtype == torch.float32:
        return values.view(torch.int32).to(torch.int64)
    if values.dtype == torch.float64:
        return values.view(torch.int64)
    return values.to(torch.int64)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.element_size() == 4 else t.view(torch.int64)


def _special_values(dtype, n, g):
    if dtype == torch.int32:
        vals = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
        vals[:3] = torch.tensor([-1, -2**31, 2**31 - 1], dtype=torch.int32)
        return vals
    if dtype == torch.int64:
        vals = torch.randint(-2**62, 2**62, (n,), generator=g, dtype=torch.int64)
        vals[:3] = torch.tensor([-1, -2**63, 2**63 - 1], dtype=torch.int64)
        return vals
    vals = torch.randn(n, generator=g, dtype=torch.float64).to(dtype) * 1e3
    specials = [float("nan"), float("-inf"), float("inf"), -0.0, 1e-40 if dtype == torch.float32 else 5e-324]
    vals[: len(specials)] = torch.tensor(specials, dtype=dtype)
    ibits = _bits(vals)
    ibits[5] = 0x7FC12345 if dtype == torch.float32 else 0x7FF8_0000_1234_5678  # NaN with a payload
    ibits[6] = -1  # all-ones pattern: a negative NaN
    return vals


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7, 1000), (257,)])
def test_staged_writes_bit_exact(device, dtype, shape):
    """The same ragged writes applied by StagedWriteTensor (reference) and by the Triton
    scatter of an independently packed [indices | words] buffer: identical bits."""
    dtypes = [torch.int32, torch.int64, torch.float32, torch.float64]
    g = torch.Generator().manual_seed(len(shape) * 10 + dtypes.index(dtype))
    ref = StagedWriteTensor(shape, dtype, device)
    table = torch.zeros(shape, dtype=dtype, device=device)
    cols = shape[1] if len(shape) == 2 else shape[0]
    idx, vals = [], []
    rows = range(shape[0]) if len(shape) == 2 else [0]
    for row in rows:
        if len(shape) == 2 and row % 3 == 2:
            continue  # untouched rows
        start = int(torch.randint(0, cols // 2, (1,), generator=g))
        n = int(torch.randint(1, cols - start, (1,), generator=g)) if len(shape) == 2 else cols - start
        v = _special_values(dtype, max(n, 8), g)[:n]
        if len(shape) == 2:
            ref.stage_write(row, start, v)
        else:
            # a 1-D table is staged one scalar at a time (stage_scalar writes row ``i``)
            for j in range(n):  # row ``start + j`` of a 1-D table, value bits kept
                ref.stage_write(start + j, 0, v[j:j + 1])
        base = row * cols + start if len(shape) == 2 else start
        idx.append(torch.arange(base, base + n, dtype=torch.int64))
        vals.append(v)
    idx, vals = torch.cat(idx), torch.cat(vals)
    assert idx.numel() > 1024 or len(shape) == 1  # several programs in the 2-D case
    packed = torch.cat([idx, _words(vals)]).to(device)
    ref.apply_staged_writes()
    apply_staged_writes_triton(table.view(-1), packed, idx.numel())
    assert torch.equal(_bits(table).cpu(), _bits(ref.gpu).cpu())
    assert int((_bits(table) != 0).sum()) >= idx.numel() - 2  # writes landed (a few values may be 0 / +0.0)


def test_staged_writes_nothing_staged(device):
    table = torch.arange(10, dtype=torch.int32, device=device)
    apply_staged_writes_triton(table, torch.zeros(0, dtype=torch.int64, device=device), 0)
    assert torch.equal(table.cpu(), torch.arange(10, dtype=torch.int32))


def test_staged_writes_reject_bad_dtype(device):
    with pytest.raises(ValueError):
        apply_staged_writes_triton(torch.zeros(4, dtype=torch.float16, device=device),
                                   torch.zeros(2, dtype=torch.int64, device=device), 1)


# ---- CUDA only ----------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
def test_prepare_reads_pinned_host_token_table():
    g = torch.Generator().manual_seed(21)
    token_ids, block_table = _state(g, 10, 64, 16)
    idx, qsl, num_computed, _ = _batch(g, 10, 64, max_reqs=7, max_prefill=30)
    num_tokens = int(qsl[-1]) + 5
    pinned = token_ids.pin_memory()
    idx, qsl, num_computed, token_dev, block_table = _to("cuda", idx, qsl, num_computed, token_ids, block_table)
    expected = prepare_inputs_ref(idx, qsl, num_computed, token_dev, block_table, 16, num_tokens)
    got = prepare_inputs_triton(idx, qsl, num_computed, pinned, block_table, 16, num_tokens)
    _assert_same(got, expected)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_replay_without_syncs():
    """Capture prepare + post-update + a staged write once, replay on new inputs copied
    into the static buffers, all under set_sync_debug_mode('error')."""
    g = torch.Generator().manual_seed(22)
    num_rows, max_len, block_size = 10, 64, 16
    token_ids, block_table = _state(g, num_rows, max_len, block_size)
    token_ids, block_table = _to("cuda", token_ids, block_table)
    max_reqs, num_tokens = 6, 96
    static = {
        "idx": torch.zeros(max_reqs, dtype=torch.int32, device="cuda"),
        "qsl": torch.zeros(max_reqs + 1, dtype=torch.int32, device="cuda"),
        "sampled": torch.zeros(max_reqs, dtype=torch.int64, device="cuda"),
        "packed": torch.zeros(8, dtype=torch.int64, device="cuda"),
    }
    num_computed = torch.zeros(num_rows, dtype=torch.int32, device="cuda")
    num_tok_table = torch.full((num_rows,), max_len, dtype=torch.int32, device="cuda")
    scalars = torch.zeros(num_rows, dtype=torch.float32, device="cuda")
    out = prepare_inputs_triton(static["idx"], static["qsl"], num_computed, token_ids, block_table,
                                block_size, num_tokens)  # warm-up compiles, gives the buffers
    post_update_triton(static["idx"], static["qsl"][1:] - static["qsl"][:-1], static["sampled"],
                       num_computed.clone(), num_tok_table.clone(), token_ids.clone())
    apply_staged_writes_triton(scalars, static["packed"], 4)
    torch.cuda.synchronize()

    def step():
        prepare_inputs_triton(static["idx"], static["qsl"], num_computed, token_ids, block_table,
                              block_size, num_tokens, out=out)
        apply_staged_writes_triton(scalars, static["packed"], 4)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _trial in range(2):
        idx, qsl, nc_cpu, _ = _batch(g, num_rows, max_len, max_reqs=max_reqs, max_prefill=12)
        idx = torch.cat([idx, torch.full((max_reqs - idx.numel(),), num_rows - 1, dtype=torch.int32)])
        qsl = torch.cat([qsl, qsl[-1].repeat(max_reqs + 1 - qsl.numel())])  # empty trailing requests
        vals = torch.randn(4, generator=g)
        packed = torch.cat([torch.tensor([0, 3, 5, 9]), vals.view(torch.int32).to(torch.int64)])
        torch.cuda.set_sync_debug_mode("error")
        try:
            static["idx"].copy_(idx.pin_memory(), non_blocking=True)
            static["qsl"].copy_(qsl.pin_memory(), non_blocking=True)
            static["packed"].copy_(packed.pin_memory(), non_blocking=True)
            num_computed.copy_(nc_cpu.pin_memory(), non_blocking=True)
            graph.replay()
            # post-update eagerly, also sync-free
            ref_tables = (num_computed.clone(), num_tok_table.clone(), token_ids.clone())
            sched = static["qsl"][1:] - static["qsl"][:-1]
            post_update_triton(static["idx"], sched, static["sampled"], num_computed.clone(),
                               num_tok_table.clone(), token_ids.clone())
        finally:
            torch.cuda.set_sync_debug_mode("default")
        expected = prepare_inputs_ref(static["idx"], static["qsl"], ref_tables[0], token_ids, block_table,
                                      block_size, num_tokens)
        _assert_same(out, expected)
        assert torch.equal(scalars[[0, 3, 5, 9]].cpu().view(torch.int32), vals.view(torch.int32))
