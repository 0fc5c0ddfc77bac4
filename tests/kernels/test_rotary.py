"""rotary_triton against the RotaryEmbedding layer's torch code: both layouts (rotate-half
and interleaved), strided q/k views, rotary_dim < head_size (pass-through tail), shuffled
positions, and the layer's dispatch (incl. MLA's one shared [T, R] key)."""

import pytest
import torch

import core_runner.kernels.rotary_triton as rope_mod
from core_runner.forward_context import set_forward_context
from core_runner.kernels.rotary_triton import rotary_triton
from core_runner.layers.rotary import RotaryEmbedding

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MAX_POS = 300


def _ref(rope, positions, q, k):
    """The layer's torch path, whatever the device."""
    cos, sin = rope.cos_sin[positions.long()].unsqueeze(1).chunk(2, dim=-1)
    return rope.rotate_ref(q, cos, sin), rope.rotate_ref(k, cos, sin)


def _qk(t, heads, kv_heads, hd, device, dtype=torch.float32, seed=0):
    """q, k as views of one fused qkv output (rows strided by its width)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * hd, generator=g).to(device, dtype)
    q, k, _ = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    positions = torch.randperm(MAX_POS, generator=g)[:t]  # random order, not 0..t-1
    return positions.to(device), q.reshape(t, heads, hd), k.reshape(t, kv_heads, hd)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("t", [1, 37])
@pytest.mark.parametrize("heads,kv_heads,hd,rot", [(4, 2, 32, 32), (3, 1, 48, 16), (6, 6, 64, 40)])
def test_matches_reference(device, neox, pos_dtype, t, heads, kv_heads, hd, rot):
    rope = RotaryEmbedding(hd, rot, MAX_POS, 10000.0, is_neox_style=neox).to(device)
    positions, q, k = _qk(t, heads, kv_heads, hd, device, seed=t + hd)
    q0, k0 = q.clone(), k.clone()
    q_out, k_out = rotary_triton(positions.to(pos_dtype), q, k, rope.cos_sin, rot, is_neox_style=neox)
    q_ref, k_ref = _ref(rope, positions, q, k)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)
    if rot < hd:  # the tail past rotary_dim is copied bit for bit
        assert torch.equal(q_out[..., rot:], q[..., rot:]) and torch.equal(k_out[..., rot:], k[..., rot:])
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_layouts_differ(device):
    """The interleaved and rotate-half outputs differ (the layout flag is not ignored)."""
    positions, q, k = _qk(4, 2, 2, 16, device, seed=3)
    outs = [rotary_triton(positions, q, k, RotaryEmbedding(16, 16, MAX_POS).to(device).cos_sin, 16,
                          is_neox_style=neox)[0] for neox in (True, False)]
    assert (outs[0] - outs[1]).abs().max() > 1e-2


def test_contiguous_inputs_many_heads(device):
    """More heads than one tile holds: several q and k tiles per token."""
    rope = RotaryEmbedding(32, 32, MAX_POS, 500.0).to(device)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(5, 70, 32, generator=g).to(device)
    k = torch.randn(5, 40, 32, generator=g).to(device)
    positions = torch.tensor([299, 0, 17, 17, 250], device=device)
    q_out, k_out = rotary_triton(positions, q, k, rope.cos_sin, 32)
    q_ref, k_ref = _ref(rope, positions, q, k)
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)


def test_layer_dispatch(device, monkeypatch):
    calls = []
    real = rope_mod.rotary_triton
    monkeypatch.setattr(rope_mod, "rotary_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rope = RotaryEmbedding(32, 16, MAX_POS, 10000.0).to(device)
    positions, q, k = _qk(6, 4, 2, 32, device, seed=8)
    with set_forward_context(None, None, "triton"):
        q_out, k_out = rope(positions, q, k)
    assert calls == [1]
    q_ref, k_ref = _ref(rope, positions, q, k)
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)
    with set_forward_context(None, None, "torch"):
        rope(positions, q, k)
    assert calls == [1]


def test_layer_dispatch_shared_key_interleaved(device, monkeypatch):
    """MLA: q_pe [T, H, R] a strided view, k_pe [T, R] one shared key; interleaved pairs."""
    calls = []
    real = rope_mod.rotary_triton
    monkeypatch.setattr(rope_mod, "rotary_triton", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    rope = RotaryEmbedding(8, 8, MAX_POS, 10000.0, is_neox_style=False).to(device)
    g = torch.Generator().manual_seed(4)
    q_full = torch.randn(9, 3, 24, generator=g).to(device)
    q_pe = q_full[..., 16:]
    k_pe = torch.randn(9, 40, generator=g).to(device)[:, 32:]
    positions = torch.randperm(MAX_POS, generator=g)[:9].to(device)
    with set_forward_context(None, None, "triton"):
        q_out, k_out = rope(positions, q_pe, k_pe)
    assert calls == [{"is_neox_style": False}] and k_out.shape == (9, 8)
    q_ref, k_ref = _ref(rope, positions, q_pe, k_pe.unsqueeze(1))
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref.squeeze(1), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hd,rot,neox", [(128, 128, True), (128, 64, True), (192, 64, False)])
def test_half_precision_gpu(dtype, hd, rot, neox):
    rope = RotaryEmbedding(hd, rot, 4096, 1e6, is_neox_style=neox).cuda()
    g = torch.Generator().manual_seed(9)
    positions = torch.randint(0, 4096, (256,), generator=g).cuda()
    qkv = torch.randn(256, 24 * hd, generator=g).cuda().to(dtype)
    q, k, _ = qkv.split([16 * hd, 4 * hd, 4 * hd], dim=-1)
    q, k = q.reshape(256, 16, hd), k.reshape(256, 4, hd)
    q_out, k_out = rotary_triton(positions, q, k, rope.cos_sin, rot, is_neox_style=neox)
    q_ref, k_ref = _ref(rope, positions, q, k)
    for out, ref in ((q_out, q_ref), (k_out, k_ref)):
        assert out.dtype == dtype
        torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)
        assert (out == ref).float().mean() > 0.999  # same fp32 math, one cast: ~all bit-equal
