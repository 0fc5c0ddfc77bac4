"""MLA attention over the latent cache: Triton kernel against the torch reference, and
the reference against the naive (non-absorbed) MLA it replaces."""
from __future__ import annotations

import pytest
import torch

from core_runner.attention.mla import mla_attention_ref
from core_runner.kernels.mla_attention_triton import mla_attention_triton


def _batch(q_lens, ctx_lens, heads, lora, rope, block_size, g, extra_tokens=0):
    """A mixed batch: random latent cache, shuffled block tables, qsl / seq_lens."""
    num_reqs = len(q_lens)
    max_blocks = max(-(-s // block_size) for s in ctx_lens)
    num_blocks = num_reqs * max_blocks + 3
    cache = torch.randn(1, num_blocks, block_size, 1, lora + rope, generator=g)
    perm = torch.randperm(num_blocks, generator=g)[: num_reqs * max_blocks]
    block_tables = perm.view(num_reqs, max_blocks).to(torch.int32)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    seq_lens = torch.tensor(ctx_lens, dtype=torch.int32)
    t = int(qsl[-1]) + extra_tokens
    q_c = torch.randn(t, heads, lora, generator=g)
    q_pe = torch.randn(t, heads, rope, generator=g)
    return q_c, q_pe, cache, qsl, seq_lens, block_tables


CASES = [
    # (q_lens, ctx_lens, heads, lora, rope, block_size)
    ([1, 1, 1], [5, 17, 33], 4, 32, 8, 4),                 # decode
    ([1, 6, 19], [9, 6, 40], 4, 32, 8, 4),                 # mixed decode / prefill / chunk
    ([3, 1, 12], [3, 30, 20], 20, 48, 16, 16),             # 20 heads: two head tiles
    ([2, 7], [2, 50], 2, 64, 8, 8),
]


@pytest.mark.parametrize("case", CASES)
def test_mla_triton_matches_ref(device, case):
    q_lens, ctx_lens, heads, lora, rope, bs = case
    g = torch.Generator().manual_seed(sum(ctx_lens))
    q_c, q_pe, cache, qsl, seq_lens, bt = _batch(q_lens, ctx_lens, heads, lora, rope, bs, g, extra_tokens=2)
    scale = 0.2
    ref = mla_attention_ref(q_c, q_pe, cache, qsl, seq_lens, bt, scale)
    dev = [x.to(device) for x in (q_c, q_pe, cache, qsl, seq_lens, bt)]
    out = mla_attention_triton(*dev, scale, max_query_len=max(q_lens))
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    assert (out[int(qsl[-1]):] == 0).all()  # padding tokens


SPLIT_CASES = [
    # decode, a request with no context, 16 heads (one head tile)
    ([1, 1, 1, 1], [70, 1, 0, 33], 16, 32, 8, 4),
    # mixed: binary-searched programs, prefill rows whose keys all lie in later splits
    ([1, 6, 19], [9, 6, 40], 4, 32, 8, 4),
]


@pytest.mark.parametrize("num_splits", [2, 3, 5])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=["decode", "mixed"])
def test_mla_split_kv_matches_ref(device, case, num_splits):
    """5 splits of <= 70 tokens in 32-token tiles leave some splits empty; the merge
    still writes zeros for the padding tokens past qsl[-1]."""
    q_lens, ctx_lens, heads, lora, rope, bs = case
    g = torch.Generator().manual_seed(num_splits)
    q_c, q_pe, cache, qsl, seq_lens, bt = _batch(q_lens, ctx_lens, heads, lora, rope, bs, g, extra_tokens=3)
    ref = mla_attention_ref(q_c, q_pe, cache, qsl, seq_lens, bt, 0.2)
    dev = [x.to(device) for x in (q_c, q_pe, cache, qsl, seq_lens, bt)]
    out = mla_attention_triton(*dev, 0.2, max_query_len=max(q_lens), max_seq_len=max(ctx_lens),
                               num_splits=num_splits)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    assert (out[int(qsl[-1]):] == 0).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: with CUDA, compiled kernels take CUDA tensors")
def test_mla_no_split_on_cpu(monkeypatch):
    """On the CPU a decode batch is not split: the merge never launches."""
    import core_runner.kernels.mla_attention_triton as mod

    g = torch.Generator().manual_seed(7)
    q_c, q_pe, cache, qsl, seq_lens, bt = _batch([1, 1], [40, 9], 4, 32, 8, 4, g, extra_tokens=1)
    ref = mla_attention_ref(q_c, q_pe, cache, qsl, seq_lens, bt, 0.2)
    monkeypatch.setattr(mod, "merge_splits", None)  # calling it would raise
    out = mla_attention_triton(q_c, q_pe, cache, qsl, seq_lens, bt, 0.2, max_query_len=1, max_seq_len=4096)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_mla_config_changes_tiles_not_result(device):
    g = torch.Generator().manual_seed(7)
    batch = _batch([1, 1], [40, 9], 4, 32, 8, 4, g, extra_tokens=1)
    ref = mla_attention_ref(*batch, 0.2)
    dev = [x.to(device) for x in batch]
    out = mla_attention_triton(*dev, 0.2, max_query_len=1, config={"BLOCK_N": 16, "num_warps": 2})
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="BLOCK_M"):
        mla_attention_triton(*dev, 0.2, config={"BLOCK_M": 16})


def test_absorbed_ref_equals_naive_mla():
    """softmax(q_nope.W_UK c + q_pe.k_pe) W_UV c == attention with expanded K and V."""
    g = torch.Generator().manual_seed(0)
    h, nope, rope, v, lora, s = 3, 8, 4, 6, 16, 11
    c = torch.randn(s, lora, generator=g)
    k_pe = torch.randn(s, rope, generator=g)
    w = torch.randn(h, nope + v, lora, generator=g)
    q_nope = torch.randn(s, h, nope, generator=g)
    q_pe = torch.randn(s, h, rope, generator=g)
    # naive
    k = torch.cat([torch.einsum("hnl,sl->shn", w[:, :nope], c), k_pe[:, None].expand(s, h, rope)], -1)
    vv = torch.einsum("hvl,sl->shv", w[:, nope:], c)
    q = torch.cat([q_nope, q_pe], -1)
    sc = torch.einsum("qhd,khd->hqk", q, k) * 0.3
    sc = sc.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
    naive = torch.einsum("hqk,khv->qhv", sc.softmax(-1), vv)
    # absorbed, through a paged cache of block size 4
    cache = torch.zeros(1, 3, 4, 1, lora + rope)
    cache.view(-1, lora + rope)[:s] = torch.cat([c, k_pe], -1)
    q_c = torch.einsum("shn,hnl->shl", q_nope, w[:, :nope])
    o = mla_attention_ref(q_c, q_pe, cache, torch.tensor([0, s]), torch.tensor([s]),
                          torch.tensor([[0, 1, 2]]), 0.3)
    torch.testing.assert_close(torch.einsum("shl,hvl->shv", o, w[:, nope:]), naive, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mla_triton_bf16_gpu_lite_shape():
    """DeepSeek-V2-Lite shape: 16 heads, kv_lora_rank 512, rope 64, bf16."""
    g = torch.Generator().manual_seed(1)
    q_c, q_pe, cache, qsl, seq_lens, bt = _batch([1] * 8 + [33], [100] * 8 + [200], 16, 512, 64, 16, g)
    dev = [x.cuda().bfloat16() if x.is_floating_point() else x.cuda() for x in (q_c, q_pe, cache, qsl, seq_lens, bt)]
    ref = mla_attention_ref(*[x.float() if x.is_floating_point() else x for x in dev[:3]], qsl, seq_lens,
                            dev[5], 0.07)
    out = mla_attention_triton(*dev, 0.07, max_query_len=33)
    torch.testing.assert_close(out.float(), ref.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("num_splits,max_seq_len", [(None, 4096), (3, 1024)])
def test_mla_split_bf16_gpu_cuda_graph(num_splits, max_seq_len):
    """V2-Lite shape, decode with split-KV (None: the heuristic gives 8 requests 16 splits
    on an H200, most empty under a 4096 bound), captured once with host bounds and
    replayed after the device metadata changed: the replay equals an eager call on the
    new metadata, and the reference."""
    g = torch.Generator().manual_seed(2)
    q_c, q_pe, cache, qsl, seq_lens, bt = _batch([1] * 8, [900, 5, 1000, 300, 1, 64, 777, 512], 16, 512, 64, 16,
                                                 g, extra_tokens=3)
    dev = [x.cuda().bfloat16() if x.is_floating_point() else x.cuda() for x in (q_c, q_pe, cache, qsl, seq_lens, bt)]
    qc, qpe, lc, qsl_d, lens, bt_d = dev
    args = dict(max_query_len=1, max_seq_len=max_seq_len, num_splits=num_splits)
    mla_attention_triton(*dev, 0.07, **args)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mla_attention_triton(*dev, 0.07, **args)
    new_lens = torch.tensor([17, 896, 1000, 0, 2, 300, 640, 129], dtype=torch.int32)  # within the tables
    lens.copy_(new_lens)
    qc.copy_(torch.randn_like(qc))
    graph.replay()
    eager = mla_attention_triton(*dev, 0.07, **args)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)
    ref = mla_attention_ref(qc.float(), qpe.float(), lc.float(), qsl, new_lens, bt_d, 0.07)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
    assert (out[8:] == 0).all()
