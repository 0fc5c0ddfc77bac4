"""gated_rms_norm_triton against GatedRMSNorm's torch code: one group and several, z a
strided view of a packed projection, fp32 and bf16, and the layer's dispatch."""
import pytest
import torch

import core_runner.kernels.gated_rms_norm_triton as mod
from core_runner.forward_context import set_forward_context
from core_runner.kernels.gated_rms_norm_triton import gated_rms_norm_triton
from core_runner.layers.mamba2 import GatedRMSNorm


def _layer(c, group, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = GatedRMSNorm(c, group, 1e-5)
    m.weight.data = (1 + 0.3 * torch.randn(c, generator=g)).to(device, dtype)
    return m


def _inputs(t, c, device, dtype, seed=1):
    """y as the scan leaves it (fp32), z a strided view of a wider projection."""
    g = torch.Generator().manual_seed(seed)
    y = (2 * torch.randn(t, c, generator=g)).to(device)
    packed = (2 * torch.randn(t, c + 24, generator=g)).to(device, dtype)
    return y, packed[:, 8:8 + c]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c,group", [(96, 96), (256, 64), (48, 16)])
def test_matches_the_torch_code(device, dtype, c, group):
    m = _layer(c, group, device, dtype)
    y, z = _inputs(7, c, device, dtype)
    assert not z.is_contiguous()
    out = gated_rms_norm_triton(y, z, m.weight, group, m.eps)
    ref = m.norm_ref(y, z)
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: one rounding of the normalised value
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    if group < c:  # normalising over the whole row instead would be far off
        whole = gated_rms_norm_triton(y, z, m.weight, c, m.eps)
        assert not torch.allclose(whole, ref, atol=0.05, rtol=0.05)


def test_empty(device):
    m = _layer(32, 32, device, torch.float32)
    y = torch.empty(0, 32, device=device)
    assert gated_rms_norm_triton(y, y, m.weight, 32, m.eps).shape == (0, 32)


def test_layer_dispatch(device, monkeypatch):
    calls = []
    real = mod.gated_rms_norm_triton
    monkeypatch.setattr(mod, "gated_rms_norm_triton", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    m = _layer(64, 32, device, torch.float32)
    y, z = _inputs(5, 64, device, torch.float32)
    with set_forward_context(None, None, "triton"):
        out = m(y, z)
    assert calls == [1]
    torch.testing.assert_close(out, m.norm_ref(y, z), atol=1e-5, rtol=1e-5)
    with set_forward_context(None, None, "torch"):
        m(y, z)
    assert calls == [1]
