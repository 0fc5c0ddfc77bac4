"""silu_mul_triton against SiluAndMul's torch code, and the layer's dispatch."""

import pytest
import torch
import torch.nn.functional as F

import core_runner.kernels.silu_mul_triton as silu_mod
from core_runner.forward_context import set_forward_context
from core_runner.kernels.silu_mul_triton import silu_mul_triton
from core_runner.layers.activation import SiluAndMul

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _ref(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy exp(100)
@pytest.mark.parametrize("t", [1, 37])
@pytest.mark.parametrize("inter", [8, 96, 1500])
def test_fp32(device, t, inter):
    g = torch.Generator().manual_seed(inter)
    x = (4 * torch.randn(t, 2 * inter, generator=g)).to(device)
    x[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])  # silu's tails
    x0 = x.clone()
    out = silu_mul_triton(x)
    assert out.shape == (t, inter) and out.is_contiguous()
    torch.testing.assert_close(out, _ref(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(x, x0)


def test_3d_and_strided_rows(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 64, generator=g).to(device)
    torch.testing.assert_close(silu_mul_triton(x), _ref(x), atol=1e-5, rtol=1e-5)
    wide = torch.randn(7, 100, generator=g).to(device)[:, 10:74]  # rows strided by 100
    torch.testing.assert_close(silu_mul_triton(wide), _ref(wide), atol=1e-5, rtol=1e-5)
    assert silu_mul_triton(torch.empty(0, 64, device=device)).shape == (0, 32)


def test_layer_dispatch(device, monkeypatch):
    calls = []
    real = silu_mod.silu_mul_triton
    monkeypatch.setattr(silu_mod, "silu_mul_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    act = SiluAndMul()
    x = torch.randn(9, 48, generator=torch.Generator().manual_seed(2)).to(device)
    with set_forward_context(None, None, "triton"):
        out = act(x)
    assert calls == [1]
    torch.testing.assert_close(out, _ref(x), atol=1e-5, rtol=1e-5)
    with set_forward_context(None, None, "torch"):
        act(x)
    assert calls == [1]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_gpu(dtype):
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(256, 2 * 3072, generator=g)).cuda().to(dtype)
    out, ref = silu_mul_triton(x), _ref(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    assert (out == ref).float().mean() > 0.99  # silu rounded to dtype before the product, as torch
