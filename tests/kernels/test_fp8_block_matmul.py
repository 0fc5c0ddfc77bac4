"""fp8_block_matmul_triton against its torch reference (kernels/fp8_block_matmul.py).

On the CPU this runs in Triton's interpreter, where the fp8 x fp8 ``tl.dot`` is exact but
the float32 -> fp8 cast mis-rounds values whose rounding carries into the exponent; the
quantization test there feeds values that need no rounding (fp8 values times power-of-two
scales, each group holding a +-448). Rounding itself is checked on the GPU.
"""
import pytest
import torch

from core_runner.kernels.fp8_block_matmul import (
    fp8_block_linear_ref,
    fp8_block_matmul_ref,
    per_token_group_quant_fp8_ref,
)
from core_runner.kernels.fp8_block_matmul_triton import (
    fp8_block_linear_triton,
    fp8_block_matmul_triton,
    per_token_group_quant_fp8_triton,
)
from core_runner.quantization import quantize_fp8_block

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _weights(n: int, k: int, block: tuple[int, int], seed: int, device: str):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.2
    q, s = quantize_fp8_block(w, block)
    return q.to(device), s.to(device)


def _exact_activations(m: int, k: int, group: int, seed: int) -> torch.Tensor:
    """x whose per-group quantization needs no rounding: fp8 values times 2**e, one +-448 per group."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(m, k, generator=g) * 60).clamp(-440, 440).to(torch.float8_e4m3fn).float()
    for start in range(0, k, group):
        q[:, start] = 448.0 * torch.sign(torch.randn(m, generator=g))
    scale = 2.0 ** torch.randint(-6, 3, (m, -(-k // group)), generator=g).float()
    return q * scale.repeat_interleave(group, dim=1)[:, :k]


# K = 80 leaves a partial last K block (b1 = 32); N = 40 a partial row block and n tiles of
# 32 that straddle row blocks of b0 = 16; M = 5 and 19 partial m tiles
@pytest.mark.parametrize("m, n, k, block", [(5, 40, 80, (16, 32)), (19, 48, 64, (32, 16)), (1, 160, 128, (128, 64))])
def test_matmul_matches_reference(device, m, n, k, block):
    w_q, w_s = _weights(n, k, block, m + n, device)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(device)
    x_q, x_s = per_token_group_quant_fp8_ref(x, block[1])
    y = fp8_block_matmul_triton(x_q, x_s, w_q, w_s, block, torch.float32)
    want = fp8_block_matmul_ref(x_q, x_s, w_q, w_s, block)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # the scales matter: a wrong block index changes the result by far more than the tolerance
    w_s2 = w_s.clone()
    w_s2[-1, -1] *= 2
    assert (fp8_block_matmul_triton(x_q, x_s, w_q, w_s2, block, torch.float32) - want).abs().max() > 1e-3


@pytest.mark.parametrize("m, k, group", [(3, 64, 32), (4, 80, 32), (2, 48, 16)])
def test_group_quant_on_exact_inputs(device, m, k, group):
    x = _exact_activations(m, k, group, seed=k).to(device)
    q, s = per_token_group_quant_fp8_triton(x, group)
    q_ref, s_ref = per_token_group_quant_fp8_ref(x, group)
    assert s.shape == (m, -(-k // group)) and torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


def test_zero_rows_and_refusals(device):
    w_q, w_s = _weights(32, 64, (16, 32), 0, device)
    x = torch.zeros(3, 64, device=device)
    y = fp8_block_linear_triton(x, w_q, w_s, (16, 32))
    assert torch.equal(y, torch.zeros(3, 32, device=device))  # all-zero groups: no NaN from 0 / 0
    assert fp8_block_linear_triton(torch.empty(0, 64, device=device), w_q, w_s, (16, 32)).shape == (0, 32)
    x_q, x_s = per_token_group_quant_fp8_ref(torch.ones(3, 64, device=device), 32)
    with pytest.raises(ValueError, match=r"w_s has shape \(1, 2\).*block \[16, 32\] needs float32 \(2, 2\)"):
        fp8_block_matmul_triton(x_q, x_s, w_q, w_s[:1].contiguous(), (16, 32))
    with pytest.raises(ValueError, match=r"b1=24.*power of two"):
        fp8_block_matmul_triton(x_q, x_s, w_q, w_s, (16, 24))
    with pytest.raises(ValueError, match=r"x_q must be float8_e4m3fn"):
        fp8_block_matmul_triton(x_q.float(), x_s, w_q, w_s, (16, 32))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("m, n, k", [(1, 512, 7168), (37, 2112, 7168), (300, 7168, 2048), (64, 200, 1000)])
def test_linear_on_the_gpu(m, n, k):
    """DeepSeek-V3 shapes (and a partial one) in bf16 with [128, 128] blocks; quantization
    rounding checked bit for bit against torch's cast."""
    block = (128, 128)
    w_q, w_s = _weights(n, k, block, n, "cuda")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to("cuda", torch.bfloat16)
    q, s = per_token_group_quant_fp8_triton(x, block[1])
    q_ref, s_ref = per_token_group_quant_fp8_ref(x, block[1])
    assert torch.equal(s, s_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    y = fp8_block_linear_triton(x, w_q, w_s, block)
    want = fp8_block_linear_ref(x, w_q, w_s, block)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2 * want.float().abs().max().item())
