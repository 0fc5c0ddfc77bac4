"""The cut sampler at the bench shape ([1024 x 151,936] fp32 logits, T 0.7, top-p 0.9).

GPU (default): per-kernel times from torch.profiler (which of read / decide / split rounds /
serial last resort costs the reads), with the rows the decide flags and those left to the last
resort, on logits randn * SCALE (3: ~half the rows flag; the bench's 4: none).

--model (CPU, torch only, no Triton): a model of the read and the decide with the kernels'
constants (lanes of top-3 lists, the lane with the largest third value read again, each part's
cut raised by halvings to <= PCAP entries, G = the largest cut, top-p read off the sorted
candidates) that counts the rows that flag on randn * SCALE logits and says why;
--plain-lanes models the lists without the lane read again (the bound is then every lane's
third value: a lane holding three nucleus tokens flags the row).

    python benchmarks/sampler_profile.py [--scale 3]
    python benchmarks/sampler_profile.py --model [--scale 4] [--seeds 0,1] [--plain-lanes]
"""
from __future__ import annotations

import argparse
import math

import torch

N, VOCAB, TEMPERATURE, TOP_P = 1024, 151936, 0.7, 0.9


def model_flags(x: torch.Tensor, parts: int, block: int, pcap: int, p: float, reread: bool = True) -> dict:
    """x = logits * inv_temp ([n, V] float32) -> per row: flag (bool), reason, candidates, G."""
    n, vocab = x.shape
    part = math.ceil(math.ceil(vocab / parts) / block) * block
    s = math.ceil(vocab / part)
    lanes = torch.nn.functional.pad(x, (0, s * part - vocab), value=float("-inf"))
    lanes = lanes.view(n, s, part // block, block).permute(0, 1, 3, 2)  # [n, part, lane, tile]
    a1, a2, a3 = lanes.topk(3, dim=3).values.unbind(3)
    m_s = a1.max(dim=2).values
    if reread:  # the lane with the largest third value, in full; its lists left out
        w = a3.argmax(dim=2)
        other = torch.ones_like(a3, dtype=torch.bool).scatter(2, w[..., None], False)
        cut = torch.where(other, a3, float("-inf")).max(dim=2).values
        a1, a2 = torch.where(other, a1, float("-inf")), torch.where(other, a2, float("-inf"))
        xw = lanes.gather(2, w[..., None, None].expand(-1, -1, 1, lanes.shape[3]))[:, :, 0]
    else:
        cut = a3.max(dim=2).values
        xw = torch.full_like(lanes[:, :, 0], float("-inf"))
    entries = torch.cat([a1, a2, xw], dim=2)
    above = lambda c: (entries > c[..., None]).sum(dim=2)  # noqa: E731
    lo, hi = torch.maximum(cut, m_s - 32.0), m_s.clone()
    for _ in range(6):  # the kernel's halvings of the cut, where more than pcap entries lie above
        mid = lo + (hi - lo) * 0.5
        fits = above(mid) <= pcap
        lo, hi = torch.where(fits, lo, mid), torch.where(fits, mid, hi)
    cut = torch.where(above(cut) > pcap, hi, cut)
    g = cut.max(dim=1).values
    m = x.max(dim=1).values
    z = torch.exp(x - m[:, None]).sum(dim=1)
    srt = torch.where(entries > cut[..., None], entries, float("-inf")).flatten(1).sort(dim=1, descending=True).values
    cand = srt > g[:, None]
    n_c = cand.sum(dim=1)
    cum = torch.where(cand, torch.exp(srt - m[:, None]), torch.zeros_like(srt)).cumsum(dim=1)
    first = (cum < p * z[:, None]).sum(dim=1)
    short = first >= n_c  # the candidates' mass stops short of p: the threshold is <= G
    thr = srt.gather(1, first.clamp(max=srt.shape[1] - 1)[:, None])[:, 0]
    flag = short | ~(thr > g)
    return {"flag": flag, "short": short, "n_c": n_c, "g": g}


def run_model(scale: float, seeds: list[int], reread: bool) -> None:
    from core_runner.sample.top_k_top_p_triton import _BLOCK, _PARTS, _PCAP

    inv = torch.tensor(1 / TEMPERATURE, dtype=torch.float32)
    for seed in seeds:
        logits = torch.randn(N, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale
        flags, short, n_c = [], [], []
        for r in range(0, N, 32):
            x = logits[r:r + 32] * inv
            res = model_flags(x, _PARTS, _BLOCK, _PCAP, TOP_P, reread)
            flags.append(res["flag"])
            short.append(res["short"])
            n_c.append(res["n_c"])
        flags, short, n_c = torch.cat(flags), torch.cat(short), torch.cat(n_c).float()
        print(f"randn * {scale}, seed {seed}, {'lane read again' if reread else 'plain lanes'}: "
              f"{int(flags.sum())} of {N} rows flag ({int(short.sum())} with the candidates' mass short of p); "
              f"candidates mean {n_c.mean():.0f}, min {n_c.min():.0f}, max {n_c.max():.0f}", flush=True)


def run_profile(scale: float) -> None:
    from torch.profiler import ProfilerActivity, profile

    from core_runner.sample.top_k_top_p_triton import cut_sample_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(N, VOCAB, device="cuda", generator=g) * scale
    inv_temp = torch.full((N,), 1 / TEMPERATURE, device="cuda")
    seeds = torch.arange(N, device="cuda", dtype=torch.int64)
    pos = torch.full((N,), 100, device="cuda", dtype=torch.int64)
    top_k = torch.full((N,), -1, device="cuda", dtype=torch.int32)
    top_p = torch.full((N,), TOP_P, device="cuda")
    log_min_p = torch.full((N,), float("-inf"), device="cuda")
    args = (logits, inv_temp, seeds, pos, top_k, top_p, log_min_p)
    for _ in range(3):
        _, flags, _, steps = cut_sample_triton(*args, details=True)
    torch.cuda.synchronize()
    print(f"randn * {scale}: flagged rows {int(flags.sum())}, left to the serial last resort {int((steps != 0).sum())}")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            cut_sample_triton(*args)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="store_true", help="CPU torch model of the flags instead of the GPU profile")
    ap.add_argument("--scale", type=float, default=None, help="logits = randn * scale (model: 4, profile: 3)")
    ap.add_argument("--seeds", default="0", help="model: generator seeds, comma-separated")
    ap.add_argument("--plain-lanes", action="store_true", help="model: no lane read again")
    a = ap.parse_args()
    if a.model:
        run_model(a.scale or 4.0, [int(v) for v in a.seeds.split(",")], not a.plain_lanes)
    else:
        run_profile(a.scale or 3.0)


if __name__ == "__main__":
    main()
