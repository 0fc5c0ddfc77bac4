"""The chunk-parallel SSD scan (mamba_ssd_triton.py) against the sequential Triton scan
and the torch chunked reference, over ragged batches: lengths around the chunk size,
with and without saved state, single-token rows, padded requests and tokens, dummy runs
(no state writes), dt limits, grouped B/C and tiled head-dim / d_state axes."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels.mamba import ssd_chunk_scan_ref
from core_runner.kernels.mamba_ssd_triton import max_num_chunks, ssd_chunk_scan_varlen_triton
from core_runner.kernels.mamba_triton import ssm_scan_varlen_triton


def _step(gen, H, P, N, G, q_lens, has_init, rows, pad_reqs=0, pad_tokens=0, num_rows=8):
    """A ragged step with x / dt / B / C as strided column views of one projection, like
    the layer's split; padded requests point at the scratch row (the last of num_rows)."""
    T = sum(q_lens) + pad_tokens
    qsl = [0]
    for q in q_lens + [0] * pad_reqs:
        qsl.append(qsl[-1] + q)
    widths = [3, H * P, H, G * N, G * N]
    proj = torch.randn(T, sum(widths), generator=gen)
    x, dt, B, C = proj.split(widths, dim=-1)[1:]
    return dict(
        x=x, dt=dt * 1.5, B=B, C=C,
        A=-torch.rand(H, generator=gen) * 2 - 0.1, D=torch.randn(H, generator=gen),
        dt_bias=torch.randn(H, generator=gen) * 0.5,
        state=torch.randn(num_rows, H, P, N, generator=gen),
        rows=rows + [num_rows - 1] * pad_reqs, has_init=has_init + [False] * pad_reqs, qsl=qsl,
        dims=dict(num_heads=H, head_dim=P, n_groups=G, d_state=N),
    )


def _run(fn, s, device, **kw):
    state = s["state"].clone().to(device)
    to = lambda t: t.to(device)  # noqa: E731
    y = fn(
        to(s["x"]), to(s["dt"]), to(s["A"]), to(s["B"]), to(s["C"]), to(s["D"]), to(s["dt_bias"]), state,
        torch.tensor(s["rows"], dtype=torch.int32, device=device), torch.tensor(s["has_init"], device=device),
        torch.tensor(s["qsl"], dtype=torch.int32, device=device), **s["dims"], **kw,
    )
    return y.cpu(), state.cpu()


def _reference(s, chunk, dt_limit=(0.0, float("inf")), write_state=True):
    """ssd_chunk_scan_ref one request at a time."""
    d = s["dims"]
    H, P, N, G = d["num_heads"], d["head_dim"], d["d_state"], d["n_groups"]
    y = torch.zeros(s["x"].shape[0], H, P)
    state = s["state"].clone()
    for i, row in enumerate(s["rows"]):
        a, b = s["qsl"][i], s["qsl"][i + 1]
        if a == b:
            continue
        init = state[row] if s["has_init"][i] else None
        yi, st = ssd_chunk_scan_ref(
            s["x"][a:b].reshape(-1, H, P), s["dt"][a:b], s["A"], s["B"][a:b].reshape(-1, G, N),
            s["C"][a:b].reshape(-1, G, N), s["D"], s["dt_bias"], init, chunk, dt_limit,
        )
        y[a:b] = yi
        if write_state:
            state[row] = st
    return y, state


def _check(s, device, chunk, dt_limit=(0.0, float("inf")), write_state=True, **tiles):
    kw = dict(dt_limit=dt_limit, write_state=write_state)
    y, st = _run(ssd_chunk_scan_varlen_triton, s, device, chunk_size=chunk, **tiles, **kw)
    y_seq, st_seq = _run(ssm_scan_varlen_triton, s, device, **kw)
    y_ref, st_ref = _reference(s, chunk, dt_limit, write_state)
    T_real = s["qsl"][-1]
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y, y_seq, **tol)
    torch.testing.assert_close(y, y_ref, **tol)
    assert torch.count_nonzero(y[T_real:]) == 0  # padding tokens
    torch.testing.assert_close(st, st_seq, **tol)
    torch.testing.assert_close(st, st_ref, **tol)
    used = {r for r, a, b in zip(s["rows"], s["qsl"], s["qsl"][1:]) if b > a} if write_state else set()
    for r in range(st.shape[0]):  # rows outside the step, the scratch row, all rows of a dummy run
        if r not in used:
            assert torch.equal(st[r], s["state"][r]), r


@pytest.mark.parametrize("chunk", [4, 8])
@pytest.mark.parametrize("shape", [(2, 4, 4, 1), (4, 8, 16, 2)], ids=["H2P4N4G1", "H4P8N16G2"])
def test_ragged_batch_matches_sequential_and_reference(device, chunk, shape):
    H, P, N, G = shape
    g = torch.Generator().manual_seed(chunk * 7 + H)
    q = [1, 3, chunk, chunk + 1, 3 * chunk + 2]
    # every length once fresh and once continuing from saved state, rows out of order
    s = _step(g, H, P, N, G, q + q[::-1], [False] * 5 + [True] * 5, [9, 0, 4, 2, 7, 1, 3, 8, 5, 6],
              pad_reqs=2, pad_tokens=3, num_rows=11)
    _check(s, device, chunk, block_n=8 if N > 8 else None)


@pytest.mark.parametrize("write_state", [True, False])
def test_padded_step_and_dummy_run(device, write_state):
    """Decode rows first, prefill chunks, then empty scratch-row requests and padded
    tokens (a CUDA-graph step); with write_state=False no row changes at all."""
    g = torch.Generator().manual_seed(5 + write_state)
    s = _step(g, 4, 8, 16, 2, [1, 1, 6, 11, 2], [True, True, False, True, True], [4, 0, 2, 5, 1],
              pad_reqs=3, pad_tokens=5)
    _check(s, device, 4, write_state=write_state)


def test_tiles_masks_and_dt_limit(device):
    """Head dim and d_state not powers of two, split into several tiles; dt clamped."""
    g = torch.Generator().manual_seed(21)
    s = _step(g, 3, 6, 12, 1, [7, 1, 10, 2], [True, False, False, True], [3, 0, 6, 2], pad_tokens=1)
    _check(s, device, 4, dt_limit=(0.3, 1.2), block_p=4, block_n=8)


def test_single_token_rows_and_tiny_steps(device):
    """Only single-token rows (the chunk kernels have nothing to do); a one-token step."""
    g = torch.Generator().manual_seed(8)
    _check(_step(g, 2, 4, 8, 2, [1, 1, 1], [True, False, True], [1, 3, 0], pad_reqs=2), device, 4)
    _check(_step(g, 2, 4, 8, 1, [1], [True], [2], pad_tokens=0), device, 4)
    _check(_step(g, 2, 4, 8, 1, [2], [True], [2], pad_reqs=1), device, 4)


def test_many_requests(device):
    """More chunks than one chunk-table program covers, requests of 0-5 tokens."""
    g = torch.Generator().manual_seed(17)
    q = torch.randint(0, 6, (60,), generator=g).tolist()
    init = (torch.rand(60, generator=g) < 0.5).tolist()
    s = _step(g, 2, 4, 4, 1, q, init, torch.randperm(60, generator=g).tolist(), pad_tokens=2, num_rows=61)
    assert sum(-(-n // 2) for n in q if n >= 2) > 64
    _check(s, device, 2)


def test_prefill_in_pieces_then_decode(device):
    """One request fed as chunked-prefill pieces (each continuing from the state the last
    wrote) and then decode steps equals one reference scan over all its tokens."""
    g = torch.Generator().manual_seed(13)
    full = _step(g, 2, 4, 8, 2, [23], [False], [0])
    y_ref, st_ref = _reference(full, 4)
    state = full["state"].clone()
    ys = []
    for a, b in [(0, 9), (9, 10), (10, 19), (19, 20), (20, 21), (21, 23)]:
        piece = dict(full, x=full["x"][a:b], dt=full["dt"][a:b], B=full["B"][a:b], C=full["C"][a:b],
                     qsl=[0, b - a], has_init=[a > 0], state=state)
        y, state = _run(ssd_chunk_scan_varlen_triton, piece, device, chunk_size=4)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, st_ref, rtol=1e-4, atol=1e-4)


def test_chunk_bound_holds():
    """max_num_chunks bounds the chunks of multi-token requests for any split of T tokens
    over R requests (exhaustive for small T, R)."""
    import itertools

    for chunk in (1, 2, 4):
        for T in range(0, 9):
            for R in range(1, 5):
                for lens in itertools.product(range(T + 1), repeat=R):
                    if sum(lens) > T:
                        continue
                    need = sum(-(-n // chunk) for n in lens if n >= 2)
                    assert need <= max_num_chunks(T, R, chunk), (chunk, T, lens)


# ---------------------------------------------------------------------------------
# GPU only: realistic tiles, bf16, CUDA-graph capture with a different replay batch
# ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_realistic_shapes(dtype):
    g = torch.Generator().manual_seed(1)
    s = _step(g, 8, 32, 128, 1, [1, 300, 64, 65, 1, 129], [True, False, True, True, True, False],
              [0, 1, 2, 3, 4, 5], pad_reqs=2, pad_tokens=7)
    for k in ("x", "B", "C", "dt"):
        s[k] = s[k].to(dtype)
    y, st = _run(ssd_chunk_scan_varlen_triton, s, "cuda", chunk_size=256)
    y_seq, st_seq = _run(ssm_scan_varlen_triton, s, "cuda")
    if dtype == torch.float32:
        torch.testing.assert_close(y, y_seq, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(st, st_seq, rtol=1e-4, atol=1e-4)
    else:  # 16-bit dot operands (as the model's dtype): error relative to the output scale
        assert (y - y_seq).abs().max() <= 1e-2 * y_seq.abs().max()
        assert (st - st_seq).abs().max() <= 1e-2 * st_seq.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_graph_replay_with_new_batch():
    """Capture with one ragged batch, refresh the device inputs in place with another of
    the same padded sizes, replay: equals an eager call on the second batch."""
    H, P, N, G = 4, 32, 64, 1
    T, R = 256, 6
    g = torch.Generator().manual_seed(2)
    first = _step(g, H, P, N, G, [100, 1, 60], [False, True, True], [0, 1, 2], pad_reqs=3, pad_tokens=95)
    second = _step(g, H, P, N, G, [1, 1, 17, 130, 2, 80], [True, True, False, True, True, False],
                   [3, 0, 1, 2, 4, 5], pad_tokens=25)
    assert first["x"].shape[0] == second["x"].shape[0] == T and len(first["rows"]) == len(second["rows"]) == R
    dev = dict(device="cuda")
    bufs = {k: first[k].contiguous().to(**dev) for k in ("x", "dt", "B", "C", "A", "D", "dt_bias")}
    state = first["state"].clone().to(**dev)
    rows = torch.tensor(first["rows"], dtype=torch.int32, **dev)
    init = torch.tensor(first["has_init"], **dev)
    qsl = torch.tensor(first["qsl"], dtype=torch.int32, **dev)

    def call():
        return ssd_chunk_scan_varlen_triton(
            bufs["x"], bufs["dt"], bufs["A"], bufs["B"], bufs["C"], bufs["D"], bufs["dt_bias"], state, rows, init,
            qsl, **first["dims"])

    call()  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = call()
    for k in bufs:
        bufs[k].copy_(second[k])
    state.copy_(second["state"])
    rows.copy_(torch.tensor(second["rows"]))
    init.copy_(torch.tensor(second["has_init"]))
    qsl.copy_(torch.tensor(second["qsl"]))
    graph.replay()
    y_eager, st_eager = _run(ssd_chunk_scan_varlen_triton, second, "cuda")
    torch.testing.assert_close(y.cpu(), y_eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state.cpu(), st_eager, rtol=1e-5, atol=1e-5)
