"""moe_align_triton against the torch moe_align: the same sorted pairs (a stable order) and
the same tile experts, for decode and prefill sizes, V2-Lite's and V3's expert counts, ids
left out (expert parallelism's -1, ids past the experts), int32 / int64 ids, no pairs."""
import pytest
import torch

from core_runner.kernels.fused_moe_triton import moe_align
from core_runner.kernels.moe_align_triton import moe_align_triton


def _ids(t, e, k, seed=0, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(dtype) if t else \
        torch.empty(0, k, dtype=dtype)


@pytest.mark.parametrize("t,e,k,block_m", [(1, 8, 2, 16), (5, 64, 6, 16), (300, 64, 6, 32), (37, 256, 8, 128),
                                           (1000, 8, 2, 64), (0, 64, 6, 16)])
def test_equals_the_torch_alignment(device, t, e, k, block_m):
    ids = _ids(t, e, k)
    want = moe_align(ids, e, block_m)
    got = moe_align_triton(ids.to(device), e, block_m)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def test_left_out_ids_and_int32(device):
    ids = _ids(70, 16, 4, seed=3, dtype=torch.int32)
    ids[::3, 0] = -1  # other ranks' experts
    ids[1::5, 1] = 16  # past the experts
    want = moe_align(ids, 16, 16)
    got = moe_align_triton(ids.to(device), 16, 16)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    pairs = got[0].cpu()
    assert not ((pairs < ids.numel()) & (ids.reshape(-1)[pairs.clamp(max=ids.numel() - 1)] < 0)).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replays_from_a_cuda_graph():
    """Captured once, replayed on new ids written into the same buffer: the decode path."""
    ids = _ids(256, 64, 6).to(torch.int32).cuda()
    moe_align_triton(ids, 64, 16)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_align_triton(ids, 64, 16)
    for seed in (5, 6):
        ids.copy_(_ids(256, 64, 6, seed=seed).to(torch.int32))
        graph.replay()
        want = moe_align(ids.cpu(), 64, 16)
        assert torch.equal(out[0].cpu(), want[0]) and torch.equal(out[1].cpu(), want[1])
