"""Sliding windows, logit soft-capping and sinks: the torch reference against a dense
formula written from transformers' eager attention (Mistral / Gemma 2 / gpt-oss), and the
Triton kernel against the reference (interpreter here, GPU under the gpu mark).

Blocks wholly before every query's window are replaced in the block table by an id far
outside the cache, so an implementation that reads a block the manager may have freed
fails with an index error instead of passing by luck.
"""
import pytest
import torch

from core_runner.attention.torch_backend import paged_attention_ref
from core_runner.kernels.paged_attention_triton import paged_attention_triton

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
JUNK = 10**6


def build(reqs, heads, kv_heads, d, bs, window, seed=0, device="cpu", dtype=torch.float32):
    """reqs [(q_len, seq_len)] -> paged tensors + each request's dense K/V."""
    g = torch.Generator().manual_seed(seed)
    nblk = [-(-s // bs) for _, s in reqs]
    num_blocks = sum(nblk) + 2
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    bt = torch.full((len(reqs), max(nblk) + 1), JUNK, dtype=torch.int32)
    kv = torch.randn(2, num_blocks, bs, kv_heads, d, generator=g)
    used = 0
    for i, ((q_len, s), n) in enumerate(zip(reqs, nblk)):
        bt[i, :n] = perm[used:used + n]
        used += n
        if window is not None:  # blocks every query's window has left: "freed"
            first_q = s - q_len
            bt[i, :max(0, first_q - window + 1) // bs] = JUNK
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor([q for q, _ in reqs]).cumsum(0)
    q = torch.randn(int(qsl[-1]) + 1, heads, d, generator=g)  # one padding token
    lens = torch.tensor([s for _, s in reqs], dtype=torch.int32)
    dense = []
    used = 0
    for (_, s), n in zip(reqs, nblk):
        blocks = perm[used:used + n].long()
        used += n
        dense.append((kv[0][blocks].reshape(-1, kv_heads, d)[:s], kv[1][blocks].reshape(-1, kv_heads, d)[:s]))
    dev = dict(device=device)
    return (q.to(dtype=dtype, **dev), kv.to(dtype=dtype, **dev), qsl, lens, bt, dense)


def dense_attention(q, k, v, q_pos, scale, window, cap, sinks):
    """transformers' eager form: scores, soft cap, mask, sinks as an extra column, softmax."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    w = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    if cap is not None:
        w = torch.tanh(w / cap) * cap
    kpos = torch.arange(k.shape[0])
    mask = kpos[None, :] > q_pos[:, None]
    if window is not None:
        mask |= kpos[None, :] <= q_pos[:, None] - window
    w = w.masked_fill(mask, float("-inf"))
    if sinks is not None:
        w = torch.cat([w, sinks.double().view(-1, 1, 1).expand(-1, w.shape[1], 1)], -1)
        w = w - w.max(-1, keepdim=True).values
        p = w.softmax(-1)[..., :-1]
    else:
        p = w.softmax(-1)
    return torch.einsum("hqk,khd->qhd", p, v.double()).float()


CASES = [  # (reqs, window, cap, sinks)
    ([(1, 37), (1, 5), (9, 40), (20, 20)], 8, None, False),
    ([(1, 37), (6, 30), (17, 17)], 5, 3.0, True),
    ([(3, 50), (1, 2)], None, 2.5, False),
    ([(1, 33), (12, 44)], None, None, True),
    ([(1, 64), (40, 70)], 16, 4.0, True),
]


@pytest.mark.parametrize("reqs,window,cap,use_sinks", CASES)
def test_reference_matches_dense_formula(reqs, window, cap, use_sinks):
    heads, kv_heads, d, bs = 4, 2, 16, 4
    q, kv, qsl, lens, bt, dense = build(reqs, heads, kv_heads, d, bs, window)
    sinks = torch.randn(heads) * 2 if use_sinks else None
    scale = 0.3
    out = paged_attention_ref(q, kv, qsl, lens, bt, scale, True, window, cap, sinks)
    for i, ((q_len, s), (k, v)) in enumerate(zip(reqs, dense)):
        a, b = int(qsl[i]), int(qsl[i + 1])
        want = dense_attention(q[a:b], k, v, torch.arange(s - q_len, s), scale, window, cap, sinks)
        torch.testing.assert_close(out[a:b], want, atol=1e-5, rtol=1e-5)


def test_options_change_the_output():
    """Each option moves the result (a no-op implementation could not pass the above by luck)."""
    reqs, heads = [(6, 30)], 4
    q, kv, qsl, lens, bt, _ = build(reqs, heads, 2, 16, 4, None)
    base = paged_attention_ref(q, kv, qsl, lens, bt, 0.3)
    for kw in (dict(sliding_window=4), dict(logits_soft_cap=0.5), dict(sinks=torch.full((heads,), 3.0))):
        other = paged_attention_ref(q, kv, qsl, lens, bt, 0.3, **kw)
        assert (other - base).abs().max() > 1e-2, kw


@pytest.mark.parametrize("reqs,window,cap,use_sinks", CASES)
@pytest.mark.parametrize("num_splits", [None, 3])
def test_triton_matches_reference(reqs, window, cap, use_sinks, num_splits, device):
    if num_splits and max(q for q, _ in reqs) > 1:
        reqs = [(1, s) for _, s in reqs]
    heads, kv_heads, d, bs = 4, 2, 16, 4
    q, kv, qsl, lens, bt, _ = build(reqs, heads, kv_heads, d, bs, window, seed=1, device=device)
    sinks = (torch.randn(heads) * 2).to(device) if use_sinks else None
    # a launch on the GPU needs every index on it; there an unread junk block id must still be in
    # range (the interpreter on the CPU keeps the junk, so a read of it would fail there)
    bt_k = bt if q.device.type == "cpu" else bt.clamp(max=kv.shape[1] - 1).to(q.device)
    out = paged_attention_triton(q, kv, qsl.to(q.device), lens.to(q.device), bt_k, 0.3, num_splits=num_splits,
                                 sliding_window=window, logits_soft_cap=cap, sinks=sinks)
    ref = paged_attention_ref(q, kv, qsl, lens, bt, 0.3, True, window, cap, sinks)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_window_refused_without_causal():
    q, kv, qsl, lens, bt, _ = build([(3, 3)], 2, 2, 16, 4, None)
    with pytest.raises(NotImplementedError, match="causal"):
        paged_attention_ref(q, kv, qsl, lens, bt, 0.3, False, 2)
    with pytest.raises(NotImplementedError, match="causal"):
        paged_attention_triton(q, kv, qsl, lens, bt, 0.3, causal=False, sliding_window=2)


@gpu
@needs_cuda
@pytest.mark.parametrize("reqs,window,cap,use_sinks", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_options(reqs, window, cap, use_sinks, dtype):
    heads, kv_heads, d, bs = 8, 2, 64, 16
    q, kv, qsl, lens, bt, _ = build(reqs, heads, kv_heads, d, bs, window, seed=2, device="cuda", dtype=dtype)
    bt_dev = bt.clamp(max=kv.shape[1] - 1).cuda()  # on the GPU an unread junk id must still be in range
    sinks = (torch.randn(heads) * 2).cuda() if use_sinks else None
    out = paged_attention_triton(q, kv, qsl.cuda(), lens.cuda(), bt_dev, 0.125, sliding_window=window,
                                 logits_soft_cap=cap, sinks=sinks)
    ref = paged_attention_ref(q.float(), kv.float(), qsl, lens, bt_dev, 0.125, True, window, cap, sinks)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
