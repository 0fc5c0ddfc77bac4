"""route_triton against the torch routing functions (layers/moe_routing.py): the same
experts in the same (descending) order and the same weights, for softmax top-k (with and
without renormalising, top_k not a power of two), DeepSeek-V2 greedy and group-limited
greedy, and DeepSeek-V3's biased grouped choice; expert counts that are not powers of two."""
import pytest
import torch

from core_runner.kernels.moe_routing_triton import route_triton
from core_runner.layers.moe_routing import grouped_topk_v2, grouped_topk_v3, softmax_topk


def _logits(t, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, e, generator=g) * 2


def _check(got, want, device):
    (gw, gi), (ww, wi) = got, want
    assert gi.dtype == torch.int32 and gw.dtype == torch.float32
    assert torch.equal(gi.cpu(), wi)
    torch.testing.assert_close(gw.cpu(), ww, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("e,k,renorm", [(64, 6, False), (60, 8, True), (128, 8, True), (8, 2, False)])
def test_softmax_topk(device, e, k, renorm):
    x = _logits(9, e)
    _check(route_triton(x.to(device), k, mode="softmax", renormalize=renorm), softmax_topk(x, k, renorm), device)


@pytest.mark.parametrize("method,e,groups,topk_group", [("greedy", 64, None, None), ("group_limited_greedy", 160, 8, 3),
                                                        ("group_limited_greedy", 64, 8, 2)])
def test_deepseek_v2(device, method, e, groups, topk_group):
    x = _logits(7, e, seed=1)
    want = grouped_topk_v2(x, 6, method, groups, topk_group, 16.0)
    got = route_triton(x.to(device), 6, mode="v2", n_group=groups if method != "greedy" else None,
                       topk_group=topk_group, routed_scaling_factor=16.0)
    _check(got, want, device)


@pytest.mark.parametrize("renorm", [True, False])
def test_deepseek_v3(device, renorm):
    x = _logits(11, 256, seed=2)
    bias = torch.randn(256, generator=torch.Generator().manual_seed(3)) * 0.5
    want = grouped_topk_v3(x, bias, 8, 8, 4, renorm, 2.5)
    got = route_triton(x.to(device), 8, mode="v3", renormalize=renorm, n_group=8, topk_group=4,
                       correction_bias=bias.to(device), routed_scaling_factor=2.5)
    _check(got, want, device)
    # the bias changes the choice, not the weights: without it other experts win
    plain = route_triton(x.to(device), 8, mode="v3", renormalize=renorm, n_group=8, topk_group=4)
    assert not torch.equal(plain[1].cpu(), want[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replays_from_a_cuda_graph():
    x = _logits(64, 256).cuda()
    bias = torch.randn(256, generator=torch.Generator().manual_seed(3)).cuda() * 0.5
    call = lambda: route_triton(x, 8, mode="v3", renormalize=True, n_group=8, topk_group=4,  # noqa: E731
                                correction_bias=bias, routed_scaling_factor=2.5)
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    x.copy_(_logits(64, 256, seed=9).cuda())
    graph.replay()
    _check(out, grouped_topk_v3(x.cpu(), bias.cpu(), 8, 8, 4, True, 2.5), "cuda")
