"""FusedMoE loaded from an fp8 checkpoint (block format and compressed-tensors per
channel): the Triton path runs the fp8 grouped GEMM (interpreter on the CPU) and equals
its W8A8 reference, the torch path stays the dequantizing one, bit for bit; tensor and
expert parallel ranks load their parts and scales and use the same kernel."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import core_runner.kernels.fused_moe_fp8_triton as fp8_kernel
from core_runner.layers.fp8_weight import dense_weight
from core_runner.layers.fused_moe import FusedMoE, expert_packed_mapping, fused_moe_ref
from core_runner.layers.fused_moe_fp8 import fused_moe_fp8_ref
from core_runner.loader.weights import load_weights
from core_runner.quantization import quantization_from_config, quantize_fp8_block
from core_runner.quantization.construction import building_for

E, H, I = 4, 64, 64
BLOCK_QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 32]}


def _ct_channel() -> dict:
    from core_runner.conformance.quantized import compressed_tensors_fp8_config

    return compressed_tensors_fp8_config("channel")


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = FusedMoE(E, H, I, impl="triton", reduce_results=False)

    packed_modules_mapping = expert_packed_mapping(E)


def _write(path: Path, qc: dict) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for e in range(E):
        for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            w = torch.randn(*shape, generator=g) * 0.3
            if qc["quant_method"] == "fp8":
                q, s = quantize_fp8_block(w, tuple(qc["weight_block_size"]))
                tensors[f"experts.{e}.{name}.weight_scale_inv"] = s
            else:
                s = w.abs().amax(1, keepdim=True) / 448
                q = (w / s).to(torch.float8_e4m3fn)
                tensors[f"experts.{e}.{name}.weight_scale"] = s
            tensors[f"experts.{e}.{name}.weight"] = q
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"quantization_config": qc}))


def _load(path: Path, qc: dict, rank: int = 0, world: int = 1, expert_parallel: bool = False,
          device: str = "cpu") -> Experts:
    from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group

    quant = quantization_from_config(type("C", (), {"quantization_config": qc})())
    prev = set_tp_group(GroupCoordinator(rank=rank, world_size=world, expert_parallel=expert_parallel))
    try:
        with building_for(quant), torch.device(device):
            model = Experts()
    finally:
        set_tp_group(prev)
    load_weights(model, path, quantization=quant)
    return model


def _inputs(t: int = 17, k: int = 2, device: str = "cpu"):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(t, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    return x.to(device), torch.rand(t, k, generator=g).to(device), ids.to(device)


def _spy(monkeypatch) -> list:
    calls = []
    real = fp8_kernel.fused_moe_fp8_triton
    monkeypatch.setattr(fp8_kernel, "fused_moe_fp8_triton", lambda *a, **kw: calls.append(a[5]) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("qc", [BLOCK_QC, _ct_channel()], ids=["block", "ct-channel"])
def test_fp8_layer_triton_runs_the_fp8_kernel_torch_dequantizes(tmp_path, monkeypatch, qc, device):
    _write(tmp_path, qc)
    moe = _load(tmp_path, qc, device=device).experts
    assert moe.w13.weight.dtype == moe.w2.weight.dtype == torch.float8_e4m3fn
    block = moe.w13.fp8_block
    x, w, ids = _inputs(device=device)
    calls = _spy(monkeypatch)
    out = moe(x, w, ids)
    assert calls == [block]
    args = (moe.w13.weight, moe.w13.weight_scale_inv, moe.w2.weight, moe.w2.weight_scale_inv, block)
    ref = fused_moe_fp8_ref(x, *args, w, ids)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    moe.impl = "torch"
    dense = fused_moe_ref(x, dense_weight(moe.w13, x.dtype), dense_weight(moe.w2, x.dtype), w, ids)
    assert torch.equal(moe(x, w, ids), dense) and calls == [block]
    assert (dense - ref).abs().max() > 1e-3 * ref.abs().max()  # the two paths really differ


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_fp8_layer_split_over_two_ranks(tmp_path, monkeypatch, expert_parallel, device):
    """Each rank's fp8 part (TP: I/2 = 32 rows of gate and up, two 16-row blocks each, and
    one 32-column block of down; EP: two whole experts) runs the fp8 kernel, and the two
    partial sums add up to the single-rank layer's output."""
    _write(tmp_path, BLOCK_QC)
    x, w, ids = _inputs(device=device)
    whole = _load(tmp_path, BLOCK_QC, device=device).experts(x, w, ids)
    calls = _spy(monkeypatch)
    total = torch.zeros_like(whole)
    for rank in range(2):
        moe = _load(tmp_path, BLOCK_QC, rank, 2, expert_parallel, device).experts
        assert moe.w13.weight.dtype == torch.float8_e4m3fn and moe.w2.weight.dtype == torch.float8_e4m3fn
        total += moe(x, w, ids)
    assert len(calls) == 2
    torch.testing.assert_close(total, whole, rtol=1e-4, atol=1e-4 * whole.abs().max().item())
