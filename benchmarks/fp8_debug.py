"""One-off GPU check of the fp8 group quantization against torch's (prints mismatches)."""
import torch

from core_runner.kernels.fp8_block_matmul import per_token_group_quant_fp8_ref
from core_runner.kernels.fp8_block_matmul_triton import per_token_group_quant_fp8_triton

for m, k in ((1, 7168), (37, 7168), (64, 1000), (300, 2048)):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to("cuda", torch.bfloat16)
    q, s = per_token_group_quant_fp8_triton(x, 128)
    qr, sr = per_token_group_quant_fp8_ref(x, 128)
    ds = (s != sr).sum().item()
    dq = (q.view(torch.uint8) != qr.view(torch.uint8))
    if ds:
        r, g = (s != sr).nonzero()[0].tolist()
        print(f"  scale triton={s[r, g].item()!r} torch={sr[r, g].item()!r}")
    print(f"m={m} k={k}: scale mismatches {ds}, q mismatches {dq.sum().item()} of {dq.numel()}")
    if dq.any():
        i = dq.nonzero()[:3]
        for r, c in i.tolist():
            v = x[r, c].float() / sr[r, c // 128]
            print(f"  x={x[r, c].item()!r} s={sr[r, c // 128].item()!r} x/s={v.item():.9g} "
                  f"triton={q[r, c].float().item()} torch={qr[r, c].float().item()}")
