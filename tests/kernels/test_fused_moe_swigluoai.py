"""FusedMoE options for gpt-oss: expert biases and the clamped SwiGLU ("swigluoai"), in the
Triton grouped GEMM (interpreter on the CPU) against the torch reference, the reference
against transformers' GptOssExperts, and the tensor / expert-parallel splits of the biases."""
from __future__ import annotations

import pytest
import torch

from core_runner.kernels.fused_moe_triton import fused_moe_triton, swigluoai_triton
from core_runner.layers.fused_moe import FusedMoE, fused_moe_ref, stacked_expert_name, swigluoai_ref


def _routing(t: int, e: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    return torch.rand(t, k, generator=g), ids


def _experts(e: int, h: int, i: int, g: torch.Generator, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Weights large enough that many gate/up values pass the clamp at 7."""
    return {"w13": torch.randn(e, 2 * i, h, generator=g) * scale, "w2": torch.randn(e, h, i, generator=g) * 0.2,
            "w13_bias": torch.randn(e, 2 * i, generator=g) * 2.0, "w2_bias": torch.randn(e, h, generator=g)}


def test_swigluoai_kernel_matches_ref(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2 * 40, generator=g) * 6  # past the clamp on both sides
    gate, up = x.chunk(2, dim=-1)
    ref = swigluoai_ref(gate, up, 1.5, 4.0)
    torch.testing.assert_close(swigluoai_triton(x.to(device), 1.5, 4.0).cpu(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation,bias", [("swigluoai", True), ("silu", True), ("swigluoai", False)])
@pytest.mark.parametrize("t,e,k,h,i", [(1, 4, 2, 32, 16), (19, 6, 3, 40, 24)])
def test_fused_moe_triton_options_match_ref(device, activation, bias, t, e, k, h, i):
    g = torch.Generator().manual_seed(t + e)
    x = torch.randn(t, h, generator=g)
    p = _experts(e, h, i, g, scale=1.0)
    if not bias:
        p["w13_bias"] = p["w2_bias"] = None
    w, ids = _routing(t, e, k, g)
    opts = dict(w13_bias=p["w13_bias"], w2_bias=p["w2_bias"], activation=activation, swiglu_alpha=1.702,
                swiglu_limit=7.0)
    ref = fused_moe_ref(x, p["w13"], p["w2"], w, ids, **opts)
    plain = fused_moe_ref(x, p["w13"], p["w2"], w, ids)
    assert (ref - plain).abs().max() > 0.1, "the options must change the output"
    dev = {k: (v.to(device) if v is not None else None) for k, v in opts.items() if k.endswith("bias")}
    out = fused_moe_triton(x.to(device), p["w13"].to(device), p["w2"].to(device), w.to(device), ids.to(device),
                           **{**opts, **dev})
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_triton_bias_skips_ids_outside_the_experts(device):
    """Expert parallelism: a pair routed to another rank's expert adds neither its product nor its bias."""
    g = torch.Generator().manual_seed(3)
    t, e, k, h, i = 11, 4, 3, 32, 16
    x = torch.randn(t, h, generator=g)
    p = _experts(e, h, i, g)
    w, ids = _routing(t, 2 * e, k, g)
    local = torch.where(ids < e, ids, -1)
    opts = dict(w13_bias=p["w13_bias"], w2_bias=p["w2_bias"], activation="swigluoai")
    expected = fused_moe_ref(x, p["w13"], p["w2"], torch.where(ids < e, w, 0.0), torch.where(ids < e, ids, 0), **opts)
    torch.testing.assert_close(fused_moe_ref(x, p["w13"], p["w2"], w, local, **opts), expected)
    dev = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in opts.items()}
    out = fused_moe_triton(x.to(device), p["w13"].to(device), p["w2"].to(device), w.to(device), local.to(device),
                           skip_invalid_ids=True, **dev)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


def _gpt_oss_tensors(e: int, h: int, i: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Hugging Face gpt-oss's stacked layout: [E, H, 2I] with interleaved gate/up columns."""
    return {"gate_up_proj": torch.randn(e, h, 2 * i, generator=g) * 0.8,
            "gate_up_proj_bias": torch.randn(e, 2 * i, generator=g) * 2.0,
            "down_proj": torch.randn(e, i, h, generator=g) * 0.2, "down_proj_bias": torch.randn(e, h, generator=g)}


def _load(moe: FusedMoE, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(moe.named_parameters())
    for name, t in tensors.items():
        target = stacked_expert_name(f"experts.{name}").removeprefix("experts.")
        param = params[target]
        param.weight_loader(param, t)


def test_reference_matches_transformers_gpt_oss_experts():
    """FusedMoE(has_bias, swigluoai) loaded from the gpt-oss layout equals GptOssExperts."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    g = torch.Generator().manual_seed(1)
    e, h, i, t, k = 4, 24, 16, 9, 2
    cfg = GptOssConfig(num_local_experts=e, hidden_size=h, intermediate_size=i, num_experts_per_tok=k)
    hf = GptOssExperts(cfg).eval()
    tensors = _gpt_oss_tensors(e, h, i, g)
    with torch.no_grad():
        for name, tensor in tensors.items():
            getattr(hf, name).copy_(tensor)
    moe = FusedMoE(e, h, i, impl="torch", has_bias=True, activation="swigluoai",
                   checkpoint_layout="transposed_interleaved")
    _load(moe, tensors)
    x = torch.randn(t, h, generator=g) * 2
    w, ids = _routing(t, e, k, g)
    with torch.no_grad():
        want = hf(x, ids.long(), w)
    torch.testing.assert_close(moe(x, w, ids), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_split_biases_sum_to_the_whole_layer(device, expert_parallel):
    """Two ranks' partial sums (torch and Triton) add up to one rank's output: w13 bias split
    with its rows (interleaved columns de-interleaved per rank), the down bias added once."""
    from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group

    g = torch.Generator().manual_seed(5)
    t, e, k, h, i = 13, 4, 2, 32, 32
    tensors = _gpt_oss_tensors(e, h, i, g)
    x = torch.randn(t, h, generator=g) * 2
    w, ids = _routing(t, e, k, g)
    opts = dict(has_bias=True, activation="swigluoai", checkpoint_layout="transposed_interleaved",
                reduce_results=False)
    whole = FusedMoE(e, h, i, impl="torch", **opts)
    _load(whole, tensors)
    want = whole(x, w, ids)
    sums = {"torch": torch.zeros(t, h), "triton": torch.zeros(t, h)}
    for rank in range(2):
        prev = set_tp_group(GroupCoordinator(rank=rank, world_size=2, expert_parallel=expert_parallel))
        try:
            layers = {impl: FusedMoE(e, h, i, impl=impl, **opts) for impl in sums}
        finally:
            set_tp_group(prev)
        for impl, moe in layers.items():
            _load(moe, tensors)
            sums[impl] += moe.to(device)(x.to(device), w.to(device), ids.to(device)).cpu()
    for impl, got in sums.items():
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m, impl=impl: f"{impl}: {m}")


def test_per_expert_biases_load_into_their_slices():
    """Per-expert checkpoints (Mixtral-style names with biases) fill the same parameters as
    the stacked tensors they are parts of."""
    g = torch.Generator().manual_seed(2)
    e, h, i = 3, 8, 4
    moe = FusedMoE(e, h, i, impl="torch", has_bias=True)
    w13, b13 = torch.randn(e, 2 * i, h, generator=g), torch.randn(e, 2 * i, generator=g)
    stacked = FusedMoE(e, h, i, impl="torch", has_bias=True)
    stacked.w13.weight_loader(stacked.w13.weight, w13)
    stacked.w13.weight_loader(stacked.w13.bias, b13)
    for ex in range(e):
        for part, rows in (("gate", slice(0, i)), ("up", slice(i, 2 * i))):
            moe.w13.weight_loader(moe.w13.weight, w13[ex, rows], (ex, part))
            moe.w13.weight_loader(moe.w13.bias, b13[ex, rows], (ex, part))
    assert torch.equal(moe.w13.weight, stacked.w13.weight) and torch.equal(moe.w13.bias, stacked.w13.bias)
    with pytest.raises(ValueError, match="expected \\(4,\\)"):
        moe.w13.weight_loader(moe.w13.bias, torch.zeros(5), (0, "gate"))


def test_options_are_checked():
    with pytest.raises(ValueError, match="activation='gelu'"):
        FusedMoE(2, 8, 4, activation="gelu")
    with pytest.raises(ValueError, match="checkpoint_layout"):
        FusedMoE(2, 8, 4, checkpoint_layout="columns")
    with pytest.raises(ValueError, match="swiglu_limit"):
        FusedMoE(2, 8, 4, activation="swigluoai", swiglu_limit=float("nan"))
    moe = FusedMoE(2, 8, 4, has_bias=True, checkpoint_layout="transposed_interleaved")
    with pytest.raises(ValueError, match="expected \\(2, 8, 8\\)"):
        moe.w13.weight_loader(moe.w13.weight, torch.zeros(2, 8, 4))
    assert stacked_expert_name("model.layers.0.mlp.experts.gate_up_proj") == "model.layers.0.mlp.experts.w13.weight"
    assert stacked_expert_name("model.layers.0.mlp.router.bias") == "model.layers.0.mlp.router.bias"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_moe_bias_swigluoai_bf16_gpu():
    g = torch.Generator().manual_seed(1)
    t, e, k, h, i = 300, 32, 4, 256, 192
    x = torch.randn(t, h, generator=g).cuda().bfloat16()
    p = {n: (v * 0.1).cuda().bfloat16() for n, v in _experts(e, h, i, g).items()}
    w, ids = _routing(t, e, k, g)
    w, ids = w.cuda(), ids.cuda()
    ref = fused_moe_ref(x.float(), p["w13"].float(), p["w2"].float(), w, ids, w13_bias=p["w13_bias"].float(),
                        w2_bias=p["w2_bias"].float(), activation="swigluoai")
    out = fused_moe_triton(x, p["w13"], p["w2"], w, ids, w13_bias=p["w13_bias"], w2_bias=p["w2_bias"],
                           activation="swigluoai")
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
