"""fp8 KV caches (kv_cache_dtype, docs/fp8_kv_cache.md) in the Triton kernels against the torch
references on the same fp8 cache: the write (saturating cast), paged attention (one pass and
split-KV, with window / soft cap / sinks) and MLA. Tiny shapes: the interpreter is slow."""
import pytest
import torch

from core_runner.attention.mla import mla_attention_ref
from core_runner.attention.torch_backend import paged_attention_ref, write_kv_ref
from core_runner.kernels.kv_write_triton import write_kv_triton
from core_runner.kernels.mla_attention_triton import mla_attention_triton
from core_runner.kernels.paged_attention_triton import paged_attention_triton

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
IDS = ["e4m3", "e5m2"]


def _bytes(t):
    return t.view(torch.uint8).cpu()


@pytest.mark.parametrize("dtype", FP8, ids=IDS)
def test_write_saturates_like_the_reference(device, dtype):
    g = torch.Generator().manual_seed(1)
    k = torch.randn(5, 2, 16, generator=g) * 300  # some past e4m3's 448
    v = torch.randn(5, 2, 16, generator=g)
    slots = torch.tensor([3, -1, 0, 7, 5])
    want = torch.zeros(2, 2, 4, 2, 16, dtype=dtype)
    write_kv_ref(want, k, v, slots)
    got = torch.zeros(2, 2, 4, 2, 16, dtype=dtype, device=device)
    write_kv_triton(got, k.to(device), v.to(device), slots.to(device))
    g8, w8 = got.float().cpu(), want.float()
    if device == "cuda":
        assert torch.equal(_bytes(got), _bytes(want))
    else:
        # Triton's interpreter (3.9) drops the carry when fp32 -> fp8 rounding crosses a power of
        # two (31.9 -> 16, not 32) and rounds subnormals differently: allow exactly those entries
        fi = torch.finfo(dtype)
        off = g8 != w8
        carry = (g8 * 2 == w8) & (torch.frexp(w8).mantissa.abs() == 0.5)
        sub = (w8.abs() <= fi.smallest_normal) & ((g8 - w8).abs() <= fi.smallest_normal * fi.eps)
        assert not (off & ~carry & ~sub).any() and off.float().mean() < 0.1
    assert torch.isfinite(got.float().cpu()).all() and got.float().abs().max() <= torch.finfo(dtype).max


def _paged_case(device, dtype, reqs, heads, kv_heads, d, bs, seed=0):
    g = torch.Generator().manual_seed(seed)
    nblk = sum(-(-s // bs) for _, s in reqs) + 1
    perm = torch.randperm(nblk, generator=g).to(torch.int32)
    width = max(-(-s // bs) for _, s in reqs)
    bt, used = torch.zeros(len(reqs), width, dtype=torch.int32), 0
    for i, (_, s) in enumerate(reqs):
        n = -(-s // bs)
        bt[i, :n] = perm[used:used + n]
        used += n
    qsl = torch.tensor([0] + torch.tensor([q for q, _ in reqs]).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor([s for _, s in reqs], dtype=torch.int32)
    cache = torch.randn(2, nblk, bs, kv_heads, d, generator=g).to(dtype)
    q = torch.randn(int(qsl[-1]), heads, d, generator=g)
    return q, cache, qsl, lens, bt


@pytest.mark.parametrize("dtype", FP8, ids=IDS)
@pytest.mark.parametrize("opts,splits", [({}, None), ({}, 2), (dict(sliding_window=3, logits_soft_cap=2.0), None)],
                         ids=["plain", "split", "window_cap"])
def test_paged_attention_reads_fp8(device, dtype, opts, splits):
    reqs = [(1, 7), (3, 5)]  # a decode row and a chunked prefill
    q, cache, qsl, lens, bt = _paged_case(device, dtype, reqs, 4, 2, 16, 4)
    sinks = torch.tensor([0.5, -1.0, 0.0, 2.0]) if opts else None
    ref = paged_attention_ref(q, cache, qsl, lens, bt, 0.25, True, opts.get("sliding_window"),
                              opts.get("logits_soft_cap"), sinks)
    dev = [x.to(device) for x in (q, cache, qsl, lens, bt)]
    out = paged_attention_triton(*dev, 0.25, max_query_len=3, max_seq_len=7, num_splits=splits,
                                 sinks=None if sinks is None else sinks.to(device), **opts)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(ref).all() and ref.abs().max() > 0


@pytest.mark.parametrize("splits", [None, 2])
def test_mla_reads_fp8(device, splits):
    g = torch.Generator().manual_seed(2)
    lora, rope, bs = 32, 8, 4
    cache = torch.randn(1, 5, bs, 1, lora + rope, generator=g).to(torch.float8_e4m3fn)
    bt = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    qsl, lens = torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([6, 3], dtype=torch.int32)
    q_c, q_pe = torch.randn(4, 2, lora, generator=g), torch.randn(4, 2, rope, generator=g)
    ref = mla_attention_ref(q_c, q_pe, cache, qsl, lens, bt, 0.2)
    dev = [x.to(device) for x in (q_c, q_pe, cache, qsl, lens, bt)]
    out = mla_attention_triton(*dev, 0.2, max_query_len=3, max_seq_len=6, num_splits=splits)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", FP8, ids=IDS)
def test_gpu_fp8_paged_attention_bf16_queries(dtype):
    """Decode + prefill rows at a realistic head size, bf16 queries over an fp8 cache, and the
    fp8 result close to the bf16-cache result (the tolerance of docs/fp8_kv_cache.md)."""
    reqs = [(1, 300), (1, 77), (64, 200)]
    q, cache, qsl, lens, bt = _paged_case("cuda", dtype, reqs, 16, 8, 128, 16, seed=5)
    q = q.cuda().bfloat16()
    dev = [x.cuda() for x in (cache, qsl, lens, bt)]
    out = paged_attention_triton(q, *dev, 128 ** -0.5, max_query_len=64, max_seq_len=300)
    ref = paged_attention_ref(q, dev[0], qsl, lens, dev[3], 128 ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
    k = torch.randn(40, 8, 128, device="cuda", dtype=torch.bfloat16)
    got = torch.zeros(2, 4, 16, 8, 128, device="cuda", dtype=dtype)
    want = got.clone()
    slots = torch.arange(40, device="cuda")
    write_kv_triton(got, k, k, slots)
    write_kv_ref(want, k, k, slots)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
