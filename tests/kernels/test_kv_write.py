"""write_kv_triton against write_kv_ref: same cache bytes, padding slots untouched."""
import pytest
import torch

from core_runner.attention.torch_backend import write_kv_ref
from core_runner.kernels.kv_write_triton import write_kv_triton


def _case(device, num_parts, num_blocks, block_size, kv_heads, head_size, num_tokens, slot_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(num_parts, num_blocks, block_size, kv_heads, head_size, generator=g)
    # distinct slots (a real scheduler never writes one slot twice in a step), some -1
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[torch.rand(num_tokens, generator=g) < 0.3] = -1
    k = torch.randn(num_tokens, kv_heads, head_size, generator=g)
    v = torch.randn(num_tokens, kv_heads, head_size, generator=g)
    return cache.to(device), k.to(device), v.to(device), slots.to(slot_dtype).to(device)


@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("kv_heads,head_size", [(2, 64), (3, 80)])
def test_matches_reference(device, slot_dtype, block_size, kv_heads, head_size):
    cache, k, v, slots = _case(device, 2, 12, block_size, kv_heads, head_size, 9, slot_dtype)
    expected = cache.clone()
    write_kv_ref(expected, k, v, slots.long())
    before = cache.clone()
    write_kv_triton(cache, k, v, slots)
    assert torch.equal(cache, expected)
    written = (cache != before).flatten(1, 2).flatten(2).any(-1).sum().item()  # (part, slot) rows
    assert written == 2 * int((slots >= 0).sum())


def test_all_padding_is_noop(device):
    cache, k, v, slots = _case(device, 2, 4, 16, 2, 64, 5, torch.int64)
    slots.fill_(-1)
    before = cache.clone()
    write_kv_triton(cache, k, v, slots)
    assert torch.equal(cache, before)


def test_key_only_cache(device):
    cache, k, _, slots = _case(device, 1, 5, 3, 2, 80, 6, torch.int64, seed=1)
    expected = cache.clone()
    write_kv_ref(expected, k, k, slots.long())
    write_kv_triton(cache, k, None, slots)
    assert torch.equal(cache, expected)


def test_strided_views_of_fused_qkv(device):
    """k and v sliced out of one [tokens, q+k+v heads, D] tensor, as a fused projection gives."""
    cache, _, _, slots = _case(device, 2, 6, 16, 2, 64, 7, torch.int64, seed=2)
    qkv = torch.randn(7, 4 + 2 + 2, 64, device=device)
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    assert not k.is_contiguous()
    expected = cache.clone()
    write_kv_ref(expected, k, v, slots.long())
    write_kv_triton(cache, k, v, slots)
    assert torch.equal(cache, expected)


def test_casts_to_cache_dtype(device):
    cache, k, v, slots = _case(device, 2, 4, 16, 2, 64, 5, torch.int64, seed=3)
    cache = cache.half()
    expected = cache.clone()
    write_kv_ref(expected, k, v, slots.long())
    write_kv_triton(cache, k, v, slots)
    assert torch.equal(cache, expected)


def test_rejects_mismatched_slot_mapping(device):
    cache, k, v, slots = _case(device, 2, 4, 16, 2, 64, 5, torch.int64)
    with pytest.raises(ValueError):
        write_kv_triton(cache, k, v, slots[:3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_gpu_large(dtype, block_size, slot_dtype):
    cache, k, v, slots = _case("cuda", 2, 600, block_size, 8, 128, 2048, slot_dtype, seed=4)
    cache, k, v = cache.to(dtype), k.to(dtype), v.to(dtype)
    expected = cache.clone()
    write_kv_ref(expected, k, v, slots.long())
    write_kv_triton(cache, k, v, slots)
    assert torch.equal(cache, expected)

