"""GemmaRMSNorm and the gated GELU layers against transformers' own modules: Gemma's
(1 + weight) norm in float32 with one cast back, and act(gate) * up for every name
``act_and_mul`` accepts, bit for bit in float32 and bfloat16."""
from __future__ import annotations

import pytest
import torch

from core_runner.layers import GATED_ACTIVATIONS, GeluAndMul, GemmaRMSNorm, SiluAndMul, act_and_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_equals_transformers(dtype):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    g = torch.Generator().manual_seed(0)
    ref = Gemma2RMSNorm(48, eps=1e-6)
    ref.weight.data = (0.3 * torch.randn(48, generator=g)).to(dtype)
    mine = GemmaRMSNorm(48, eps=1e-6)
    mine.weight.data = ref.weight.data.clone()
    x = (2 * torch.randn(5, 3, 48, generator=g)).to(dtype)
    torch.testing.assert_close(mine(x), ref(x), atol=0, rtol=0)
    r = torch.randn(5, 3, 48, generator=g).to(dtype)
    out, res = mine(x, r)
    torch.testing.assert_close(res, r + x, atol=0, rtol=0)
    torch.testing.assert_close(out, ref(r + x), atol=0, rtol=0)
    assert out.dtype == dtype


def test_gemma_rms_norm_starts_at_identity_scale():
    """A zero weight (the checkpoint's centre) scales by one, not by zero."""
    x = torch.randn(4, 16)
    torch.testing.assert_close(GemmaRMSNorm(16)(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize("name", GATED_ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_and_mul_equals_transformers(name, dtype):
    from transformers.activations import ACT2FN

    x = (3 * torch.randn(7, 2 * 24, generator=torch.Generator().manual_seed(1))).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(act_and_mul(name)(x), ACT2FN[name](gate) * up, atol=0, rtol=0)


def test_act_and_mul_kinds_and_refusals():
    assert isinstance(act_and_mul("silu"), SiluAndMul)
    assert act_and_mul("gelu").approximate == "none" and act_and_mul("gelu_pytorch_tanh").approximate == "tanh"
    for bad in ("gelu_new", "relu", "gelu_fast"):
        with pytest.raises(ValueError, match=repr(bad)):
            act_and_mul(bad)
    with pytest.raises(ValueError, match="approximate='erf'"):
        GeluAndMul("erf")
