"""Per-kernel GPU times of the cut sampler at the bench shape ([1024 x 151,936] fp32,
T 0.7, top-p 0.9), from torch.profiler: which of read / decide / fallback costs the reads."""
import torch
from torch.profiler import ProfilerActivity, profile

from core_runner.sample.top_k_top_p_triton import cut_sample_triton


def main() -> None:
    n, vocab = 1024, 151936
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(n, vocab, device="cuda", generator=g) * 3
    inv_temp = torch.full((n,), 1 / 0.7, device="cuda")
    seeds = torch.arange(n, device="cuda", dtype=torch.int64)
    pos = torch.full((n,), 100, device="cuda", dtype=torch.int64)
    top_k = torch.full((n,), -1, device="cuda", dtype=torch.int32)
    top_p = torch.full((n,), 0.9, device="cuda")
    log_min_p = torch.full((n,), float("-inf"), device="cuda")
    args = (logits, inv_temp, seeds, pos, top_k, top_p, log_min_p)
    for _ in range(3):
        _, flags = cut_sample_triton(*args, with_flags=True)
    torch.cuda.synchronize()
    print("fallback rows", int(flags.sum()))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            cut_sample_triton(*args)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


if __name__ == "__main__":
    main()
