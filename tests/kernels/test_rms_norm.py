"""rms_norm_triton against the RMSNorm layer's torch code: 2-D and strided 3-D inputs,
the fused residual add (exact sum), inputs left untouched, and the layer's dispatch."""

import pytest
import torch

import core_runner.kernels.rms_norm_triton as rms_mod
from core_runner.forward_context import set_forward_context
from core_runner.kernels.rms_norm_triton import rms_norm_triton
from core_runner.layers.norm import RMSNorm

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _layer(d, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = RMSNorm(d, 1e-6)
    m.weight.data = (1 + 0.3 * torch.randn(d, generator=g)).to(device, dtype)
    return m


def _ref(m, x, residual=None):
    """The layer's torch path, whatever the device."""
    if residual is None:
        return m.norm_ref(x)
    s = x + residual
    return m.norm_ref(s), s


@pytest.mark.parametrize("d", [16, 96, 1024])
@pytest.mark.parametrize("t", [1, 37])
def test_2d_fp32(device, d, t):
    m = _layer(d, device)
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(t, d, generator=g)).to(device)
    torch.testing.assert_close(rms_norm_triton(x, m.weight, m.eps), _ref(m, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d", [64, 1000])
def test_residual_exact_sum_and_inputs_untouched(device, d):
    m = _layer(d, device)
    g = torch.Generator().manual_seed(2)
    x, r = torch.randn(2, 37, d, generator=g).to(device)
    x0, r0 = x.clone(), r.clone()
    out, new_res = rms_norm_triton(x, m.weight, m.eps, r)
    ref_out, ref_res = _ref(m, x, r)
    assert torch.equal(new_res, ref_res)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    assert torch.equal(x, x0) and torch.equal(r, r0)
    assert out.is_contiguous() and new_res.is_contiguous()
    assert new_res.data_ptr() not in (x.data_ptr(), r.data_ptr())


@pytest.mark.parametrize("t", [1, 37])
def test_3d_strided_views_of_fused_qkv(device, t):
    """q/k norms read split views of a fused qkv output: rows strided by its width."""
    heads, kv_heads, hd = 4, 2, 32
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * hd, generator=g).to(device)
    q, k, _ = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    q, k = q.reshape(t, heads, hd), k.reshape(t, kv_heads, hd)
    assert t == 1 or not (q.is_contiguous() or k.is_contiguous())
    m = _layer(hd, device)
    for v in (q, k):
        out = rms_norm_triton(v, m.weight, m.eps)
        assert out.shape == v.shape and out.is_contiguous()
        torch.testing.assert_close(out, _ref(m, v), atol=1e-5, rtol=1e-5)


def test_2d_strided_rows_with_residual(device):
    g = torch.Generator().manual_seed(4)
    wide = torch.randn(9, 80, generator=g).to(device)
    x = wide[:, 8:72]  # rows strided by 80
    r = torch.randn(9, 64, generator=g).to(device)
    m = _layer(64, device)
    out, s = rms_norm_triton(x, m.weight, m.eps, r)
    ref_out, ref_s = _ref(m, x, r)
    assert torch.equal(s, ref_s)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)


def test_empty(device):
    m = _layer(32, device)
    x = torch.empty(0, 32, device=device)
    out, s = rms_norm_triton(x, m.weight, m.eps, x)
    assert out.shape == (0, 32) and s.shape == (0, 32)


def test_layer_dispatch(device, monkeypatch):
    """Inside a triton-backend step the layer calls the kernel; a torch step does not."""
    calls = []
    real = rms_mod.rms_norm_triton
    monkeypatch.setattr(rms_mod, "rms_norm_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    m = _layer(64, device)
    g = torch.Generator().manual_seed(5)
    x, r = torch.randn(2, 5, 64, generator=g).to(device)
    heads = torch.randn(5, 3 * 64, generator=g).to(device)[:, 64:].reshape(5, 2, 64)  # strided 3-D
    with set_forward_context(None, None, "triton"):
        out, s = m(x, r)
        out3 = m(heads)
    assert calls == [1, 1]
    ref_out, ref_s = _ref(m, x, r)
    assert torch.equal(s, ref_s)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out3, _ref(m, heads), atol=1e-5, rtol=1e-5)
    with set_forward_context(None, None, "torch"):
        m(x, r)
        m(heads)
    assert calls == [1, 1]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [128, 1024, 5120])
def test_half_precision_gpu(dtype, d):
    m = _layer(d, "cuda", dtype)
    g = torch.Generator().manual_seed(6)
    x, r = (2 * torch.randn(2, 300, d, generator=g)).cuda().to(dtype)
    out, s = rms_norm_triton(x, m.weight, m.eps, r)
    ref_out, ref_s = _ref(m, x, r)
    assert torch.equal(s, ref_s)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    # bit-exact except where the fp32 sum order tips a rounding: nearly every element
    assert (out == ref_out).float().mean() > 0.99
    # fp32 weight with a half input: output promotes to fp32, as the torch code does
    m32 = _layer(d, "cuda", torch.float32)
    out32 = rms_norm_triton(x, m32.weight, m.eps)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32, _ref(m32, x), atol=2e-2, rtol=2e-2)


def _gemma_layer(d, device, dtype=torch.float32, seed=7):
    from core_runner.layers.norm import GemmaRMSNorm

    g = torch.Generator().manual_seed(seed)
    m = GemmaRMSNorm(d, 1e-6)
    m.weight.data = (0.3 * torch.randn(d, generator=g)).to(device, dtype)  # zero-centred, as checkpoints store it
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_mode_matches_gemma_rms_norm(device, dtype):
    """(1 + weight) in fp32, one rounding to x's dtype; 2-D with a residual and strided 3-D heads."""
    m = _gemma_layer(256, device, dtype)
    g = torch.Generator().manual_seed(8)
    x, r = (2 * torch.randn(2, 11, 256, generator=g)).to(device, dtype)
    out, s = rms_norm_triton(x, m.weight, m.eps, r, gemma=True)
    ref_s = x + r
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: a rounding tipped by the sum order
    assert out.dtype == dtype
    if device == "cuda" or dtype == torch.float32:
        assert torch.equal(s, ref_s)
    else:  # the interpreter's fp32 -> bf16 conversion does not round to nearest
        torch.testing.assert_close(s, ref_s, atol=tol, rtol=tol)
    torch.testing.assert_close(out, m.norm_ref(ref_s), atol=tol, rtol=tol)
    # the plain kernel would scale by weight alone: far off
    assert not torch.allclose(rms_norm_triton(ref_s, m.weight, m.eps), m.norm_ref(ref_s), atol=0.1, rtol=0.1)
    heads = (torch.randn(5, 3 * 256, generator=g)).to(device, dtype)[:, 256:].reshape(5, 2, 256)
    torch.testing.assert_close(rms_norm_triton(heads, m.weight, m.eps, gemma=True), m.norm_ref(heads), atol=tol,
                               rtol=tol)


def test_gemma_layer_dispatch(device, monkeypatch):
    calls = []
    real = rms_mod.rms_norm_triton
    monkeypatch.setattr(rms_mod, "rms_norm_triton", lambda *a, **kw: calls.append(kw.get("gemma")) or real(*a, **kw))
    m = _gemma_layer(64, device)
    g = torch.Generator().manual_seed(9)
    x, r = torch.randn(2, 5, 64, generator=g).to(device)
    with set_forward_context(None, None, "triton"):
        out, s = m(x, r)
    assert calls == [True]
    torch.testing.assert_close(out, m.norm_ref(x + r), atol=1e-5, rtol=1e-5)
    with set_forward_context(None, None, "torch"):
        m(x, r)
    assert calls == [True]
