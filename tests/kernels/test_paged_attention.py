"""paged_attention_triton against paged_attention_ref.

Batches are built to hit each way the kernel maps programs to work: decode-only
(one query block per request), mixed prefill/decode (binary search over
query_start_loc, several blocks per request), padded requests and padding tokens
past query_start_loc[-1], the split-KV path, and scattered (permuted) blocks.
"""
import pytest
import torch

from core_runner.attention.backend import AttnMetadata
from core_runner.attention.torch_backend import TorchPagedAttention, paged_attention_ref
from core_runner.kernels.paged_attention_triton import paged_attention_triton

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make_batch(device, reqs, num_heads, kv_heads, head_size, block_size, dtype=torch.float32,
               extra_tokens=0, seed=0):
    """reqs: [(q_len, seq_len)]; blocks are handed out in a random order so that a
    kernel ignoring the block table cannot pass. extra_tokens: padding past qsl[-1]."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_req = [-(-s // block_size) for _, s in reqs]
    num_blocks = sum(blocks_per_req) + 3
    max_blocks = max(max(blocks_per_req), 1) + 2  # wider than needed, like a real table
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    block_tables = torch.full((len(reqs), max_blocks), 10**6, dtype=torch.int32)  # junk past the end
    used = 0
    for i, n in enumerate(blocks_per_req):
        block_tables[i, :n] = perm[used:used + n]
        used += n
    q_lens = torch.tensor([q for q, _ in reqs], dtype=torch.int32)
    qsl = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qsl[1:] = q_lens.cumsum(0)
    num_tokens = int(qsl[-1]) + extra_tokens
    kv_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_size, generator=g)
    q = torch.randn(num_tokens, num_heads, head_size, generator=g)
    seq_lens = torch.tensor([s for _, s in reqs], dtype=torch.int32)
    to = dict(device=device)
    return (q.to(dtype=dtype, **to), kv_cache.to(dtype=dtype, **to), qsl.to(**to), seq_lens.to(**to),
            block_tables.to(**to), qsl, seq_lens)


def check(device, reqs, num_heads, kv_heads, head_size, block_size, causal=True, num_splits=None,
          dtype=torch.float32, atol=1e-4, extra_tokens=1, pass_bounds=True, seed=0):
    q, kv, qsl, lens, bt, qsl_cpu, lens_cpu = make_batch(
        device, reqs, num_heads, kv_heads, head_size, block_size, dtype, extra_tokens, seed)
    scale = head_size ** -0.5
    bounds = {}
    if pass_bounds:
        bounds = dict(max_query_len=max(q for q, _ in reqs), max_seq_len=max(s for _, s in reqs))
    out = paged_attention_triton(q, kv, qsl, lens, bt, scale, causal=causal, num_splits=num_splits, **bounds)
    ref = paged_attention_ref(q, kv, qsl_cpu, lens_cpu, bt, scale, causal)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol)
    return out, qsl_cpu, lens_cpu


# (q_len, seq_len): a chunked prefill with cached context, a fresh prefill, decode
# rows, a request with no query tokens and a padded one (seq_len 0).
MIXED = [(5, 9), (4, 4), (1, 7), (1, 1), (0, 0), (1, 0), (3, 140)]


@pytest.mark.parametrize("head_size", [64, 80])
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("num_heads,kv_heads", [(2, 2), (4, 2), (8, 2)], ids=["mha", "gqa2", "gqa4"])
def test_mixed_batch(device, num_heads, kv_heads, head_size, block_size):
    out, qsl, _ = check(device, MIXED, num_heads, kv_heads, head_size, block_size)
    # the (1, 0) request and the padding token past qsl[-1] come back as zeros
    assert torch.all(out[int(qsl[5]):int(qsl[6])] == 0) and torch.all(out[int(qsl[-1]):] == 0)


@pytest.mark.parametrize("num_heads,kv_heads", [(2, 2), (4, 2), (8, 2)], ids=["mha", "gqa2", "gqa4"])
def test_decode_only(device, num_heads, kv_heads):
    reqs = [(1, 37), (1, 1), (1, 0), (1, 16), (1, 70)]
    check(device, reqs, num_heads, kv_heads, 64, 16, extra_tokens=3)


@pytest.mark.parametrize("num_heads,kv_heads", [(2, 2), (8, 2)], ids=["mha", "gqa4"])
def test_long_prefill_spans_query_blocks(device, num_heads, kv_heads):
    """q_len past BLOCK_Q (64 tokens / group) so one request needs several programs."""
    reqs = [(1, 12), (70, 75), (33, 33), (1, 5)]
    check(device, reqs, num_heads, kv_heads, 64, 16)


def test_bounds_default_to_device_values(device):
    check(device, MIXED, 4, 2, 64, 3, pass_bounds=False)


@pytest.mark.parametrize("block_size", [3, 16])
@pytest.mark.parametrize("num_heads,kv_heads", [(2, 2), (4, 1)], ids=["mha", "gqa4"])
def test_non_causal(device, num_heads, kv_heads, block_size):
    reqs = [(6, 6), (3, 3), (0, 0), (2, 9)]
    out_nc, _, _ = check(device, reqs, num_heads, kv_heads, 64, block_size, causal=False)
    out_c, _, _ = check(device, reqs, num_heads, kv_heads, 64, block_size, causal=True)
    assert not torch.allclose(out_nc[:6], out_c[:6])  # the mask really changes something


@pytest.mark.parametrize("num_heads,kv_heads,num_splits", [(2, 2, 2), (8, 2, 3), (4, 2, 8)])
def test_split_kv(device, num_splits, num_heads, kv_heads):
    """8 splits of <= 140 tokens in 32/64-token tiles leaves some splits empty."""
    reqs = [(1, 140), (1, 1), (1, 0), (1, 65), (0, 0)]
    check(device, reqs, num_heads, kv_heads, 80, 16, num_splits=num_splits, extra_tokens=2)


def test_split_kv_mixed_and_non_causal(device):
    check(device, MIXED, 4, 2, 64, 3, num_splits=3)
    check(device, [(4, 4), (1, 90)], 4, 2, 64, 16, causal=False, num_splits=2)


def test_strided_query(device):
    """q as a view of a fused qkv output (row stride > heads * head_size)."""
    q, kv, qsl, lens, bt, qsl_cpu, lens_cpu = make_batch(device, MIXED, 4, 2, 64, 16)
    qkv = torch.cat([q, torch.randn(q.shape[0], 4, 64, device=device)], dim=1)
    qv = qkv[:, :4]
    assert not qv.is_contiguous()
    out = paged_attention_triton(qv, kv, qsl, lens, bt, 0.125, max_query_len=5, max_seq_len=140)
    ref = paged_attention_ref(q, kv, qsl_cpu, lens_cpu, bt, 0.125)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_backend_matches_torch_backend(device):
    from core_runner.attention.triton_backend import TritonPagedAttention

    reqs = [(3, 8), (1, 5)]
    q, kv, qsl, lens, bt, qsl_cpu, lens_cpu = make_batch(device, reqs, 4, 2, 64, 3, extra_tokens=1)
    kv.zero_()
    md = AttnMetadata(num_reqs=2, num_tokens=q.shape[0], query_start_loc=qsl, seq_lens=lens,
                      block_tables=bt, slot_mapping=torch.empty(0), query_start_loc_cpu=qsl_cpu,
                      seq_lens_cpu=lens_cpu, max_query_len=3, max_seq_len=8)
    # write the new tokens through both backends, then attend
    pos = [5, 6, 7, 4]
    req = [0, 0, 0, 1]
    md.slot_mapping = torch.tensor([int(bt[r, p // 3]) * 3 + p % 3 for r, p in zip(req, pos)] + [-1],
                                   device=device)
    k, v = torch.randn(2, q.shape[0], 2, 64, device=device).unbind(0)
    kv_ref = kv.clone()
    triton_be, torch_be = TritonPagedAttention(), TorchPagedAttention()
    assert triton_be.name == "triton"
    triton_be.write_kv(kv, k, v, md)
    torch_be.write_kv(kv_ref, k, v, md)
    assert torch.equal(kv, kv_ref)
    torch.testing.assert_close(triton_be.forward(q, kv, md, 0.125), torch_be.forward(q, kv_ref, md, 0.125),
                               atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- GPU only: real shapes
QWEN3 = dict(num_heads=16, kv_heads=8, head_size=128, block_size=16)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_gpu_decode_batch(dtype, num_splits):
    g = torch.Generator().manual_seed(1)
    reqs = [(1, int(s)) for s in torch.randint(1, 900, (96,), generator=g)] + [(1, 0), (0, 0)]
    check("cuda", reqs, **QWEN3, dtype=dtype, num_splits=num_splits, atol=2e-2, extra_tokens=5)


@gpu
@needs_cuda
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_heads,kv_heads,head_size", [(16, 8, 128), (32, 8, 64), (12, 4, 80)])
def test_gpu_mixed_bf16(num_heads, kv_heads, head_size, causal):
    reqs = [(1, 300), (1, 17), (200, 700), (1, 1), (64, 64), (0, 0), (130, 131)]
    check("cuda", reqs, num_heads, kv_heads, head_size, 16, causal=causal, dtype=torch.bfloat16,
          atol=2e-2, extra_tokens=7)


@gpu
@needs_cuda
def test_gpu_mixed_graph_replay():
    """A mixed batch captured with host bounds, replayed after the per-request query
    lengths moved (a decode row became a chunk, a chunk became decodes): each program's
    request is found on the device, so the replay follows the new lengths."""
    reqs = [(1, 300), (40, 100), (1, 1000), (20, 20), (1, 7)]
    q, kv, qsl, lens, bt, qsl_cpu, _ = make_batch("cuda", reqs, 16, 8, 128, 16, torch.bfloat16)
    args = dict(causal=True, max_query_len=63, max_seq_len=1000)
    paged_attention_triton(q, kv, qsl, lens, bt, 0.088, **args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_triton(q, kv, qsl, lens, bt, 0.088, **args)
    new_q_lens = torch.tensor([30, 1, 1, 30, 1], dtype=torch.int32)  # same 63 tokens, within each table
    new_qsl = torch.zeros(6, dtype=torch.int32)
    new_qsl[1:] = new_q_lens.cumsum(0)
    new_lens = torch.tensor([300, 50, 1000, 31, 7], dtype=torch.int32)
    qsl.copy_(new_qsl)
    lens.copy_(new_lens)
    q.copy_(torch.randn_like(q))
    graph.replay()
    ref = paged_attention_ref(q, kv, new_qsl, new_lens, bt, 0.088)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 4])
def test_gpu_cuda_graph_replay(num_splits):
    """Captured once with host-side bounds, replayed after the device metadata changed:
    a host read of device values inside the call would break capture or go stale."""
    reqs = [(1, 300), (1, 40), (1, 1000), (1, 7)]
    q, kv, qsl, lens, bt, qsl_cpu, _ = make_batch("cuda", reqs, 16, 8, 128, 16, torch.bfloat16)
    args = dict(causal=True, max_query_len=1, max_seq_len=1000, num_splits=num_splits)
    paged_attention_triton(q, kv, qsl, lens, bt, 0.088, **args)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_triton(q, kv, qsl, lens, bt, 0.088, **args)
    new_lens = torch.tensor([12, 33, 999, 0], dtype=torch.int32)  # within each table's blocks
    lens.copy_(new_lens)
    q.copy_(torch.randn_like(q))
    graph.replay()
    ref = paged_attention_ref(q, kv, qsl_cpu, new_lens, bt, 0.088)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
