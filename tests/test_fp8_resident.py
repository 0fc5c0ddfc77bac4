"""Resident fp8 weights in core_runner.layers, and compressed-tensors checkpoints.

Tiny Linear layers loaded through ``load_weights`` from fp8 checkpoints (block format and
compressed-tensors per-channel / per-tensor): weights stay float8_e4m3fn, the torch path
equals a matmul with the dequantized weight, the Triton path (interpreter) equals the
W8A8 reference, unaligned fused parts are refused by name, unquantized tensors go dense.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from core_runner.layers import MergedColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from core_runner.layers.fp8_weight import dense_weight
from core_runner.loader.weights import load_weights
from core_runner.quantization import quantization_from_config, quantize_fp8_block
from core_runner.quantization.construction import building_for

BLOCK_QC = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}


def _ct(strategy: str) -> dict:
    from core_runner.conformance.quantized import compressed_tensors_fp8_config

    return compressed_tensors_fp8_config(strategy)


class Tiny(nn.Module):
    def __init__(self, gate_rows: int = 32) -> None:
        super().__init__()
        self.gate_up = MergedColumnParallelLinear(32, [gate_rows, 32])
        self.down = RowParallelLinear(gate_rows, 32, bias=True)
        self.qkv = QKVParallelLinear(32, 16, 2, 1)
        self.router = ReplicatedLinear(32, 4)  # stored unquantized

    packed_modules_mapping = {"gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "q_proj": ("qkv", "q"),
                              "k_proj": ("qkv", "k"), "v_proj": ("qkv", "v")}


def _quantize(w: torch.Tensor, qc: dict) -> tuple[torch.Tensor, torch.Tensor, str]:
    if qc["quant_method"] == "fp8":
        q, s = quantize_fp8_block(w, tuple(qc["weight_block_size"]))
        return q, s, "_scale_inv"
    if qc["config_groups"]["group_0"]["weights"]["strategy"] == "channel":
        s = w.abs().amax(1, keepdim=True) / 448
    else:
        s = w.abs().amax().reshape(1) / 448
    return (w / s).to(torch.float8_e4m3fn), s, "_scale"


def _write(path: Path, qc: dict, gate_rows: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"gate_proj": (gate_rows, 32), "up_proj": (32, 32), "down": (32, gate_rows), "q_proj": (32, 32),
              "k_proj": (16, 32), "v_proj": (16, 32)}
    tensors, dense = {}, {}
    for name, shape in shapes.items():
        w = torch.randn(*shape, generator=g)
        q, s, suffix = _quantize(w, qc)
        tensors[f"{name}.weight"], tensors[f"{name}.weight{suffix}"] = q, s
        dense[name] = q.float() * (s.float() if suffix == "_scale" else
                                   s.repeat_interleave(16, 0).repeat_interleave(16, 1)[: shape[0], : shape[1]])
    tensors["down.bias"] = dense["down.bias"] = torch.randn(32, generator=g)
    tensors["router.weight"] = dense["router"] = torch.randn(4, 32, generator=g)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    return dense


def _load(path: Path, qc: dict, gate_rows: int = 32) -> Tiny:
    quant = quantization_from_config(type("C", (), {"quantization_config": qc})())
    with building_for(quant):
        model = Tiny(gate_rows)
    load_weights(model, path, quantization=quant)
    return model


@pytest.mark.parametrize("qc", [BLOCK_QC, _ct("channel"), _ct("tensor")], ids=["block", "ct-channel", "ct-tensor"])
def test_weights_stay_fp8_and_torch_path_matches_dequantized(tmp_path, qc):
    dense = _write(tmp_path, qc)
    m = _load(tmp_path, qc)
    for mod in (m.gate_up, m.down, m.qkv):
        assert mod.weight.dtype == torch.float8_e4m3fn and mod.weight_scale_inv.dtype == torch.float32
    assert m.router.weight.dtype == torch.float32 and m.router.fp8_block is None  # unquantized: dense
    assert torch.equal(m.router.weight, dense["router"])  # read in float32, never through fp8
    assert torch.equal(dense_weight(m.gate_up), torch.cat([dense["gate_proj"], dense["up_proj"]]))
    assert torch.equal(dense_weight(m.qkv), torch.cat([dense["q_proj"], dense["k_proj"], dense["v_proj"]]))
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m.down(x), x @ dense["down"].T + dense["down.bias"], rtol=0, atol=1e-5)
    torch.testing.assert_close(m.qkv(x), x @ dense_weight(m.qkv).T, rtol=0, atol=0)


def test_unaligned_fused_part_goes_dense_with_a_warning_naming_it(tmp_path, caplog):
    dense = _write(tmp_path, BLOCK_QC, gate_rows=24)  # up starts at row 24, inside a 16-row block
    with caplog.at_level("WARNING", logger="core_runner.layers.fp8_weight"):
        m = _load(tmp_path, BLOCK_QC, gate_rows=24)
    msg = r"kept dense .*rows \[0, 24\) of the fp8 weight .* do not align to its scale blocks of 16"
    assert any(__import__("re").search(msg, r.getMessage()) for r in caplog.records), caplog.text
    assert m.gate_up.weight.dtype == torch.float32 and m.gate_up.fp8_block is None
    assert torch.equal(m.gate_up.weight, torch.cat([dense["gate_proj"], dense["up_proj"]]))
    assert m.qkv.weight.dtype == torch.float8_e4m3fn  # the aligned layers stay fp8


def test_compressed_tensors_refusals_name_the_scheme():
    bad = _ct("channel")
    bad["config_groups"]["group_0"]["weights"].update(type="int", strategy="group", group_size=128)
    with pytest.raises(ValueError, match="config_groups\\['group_0'\\].*type='int'.*strategy='group'"):
        quantization_from_config(type("C", (), {"quantization_config": bad})())
    other = {**_ct("channel"), "format": "pack-quantized"}
    with pytest.raises(ValueError, match="format='pack-quantized'"):
        quantization_from_config(type("C", (), {"quantization_config": other})())


TRITON_SCRIPT = """
import sys, torch
sys.path.insert(0, 'tests')
from pathlib import Path
import test_fp8_resident as t
from core_runner.forward_context import set_forward_context
from core_runner.kernels.fp8_block_matmul import fp8_block_linear_ref
qc = t.BLOCK_QC if sys.argv[2] == 'block' else t._ct('channel')
t._write(Path(sys.argv[1]), qc)
m = t._load(Path(sys.argv[1]), qc)
# values on the fp8 grid with power-of-two group maxima: the interpreter's cast then rounds nothing
x = torch.tensor([[1.0, -0.5, 0.25, 2.0] * 8, [0.5, 1.0, -2.0, 0.125] * 8])
with set_forward_context(None, None, kernels='triton'):
    y = m.qkv(x)
ref = fp8_block_linear_ref(x, m.qkv.weight, m.qkv.weight_scale_inv, m.qkv.fp8_block)
torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
assert not torch.equal(y, x @ t.dense_weight(m.qkv).T * 0)
print('ok')
"""


@pytest.mark.parametrize("fmt", ["block", "ct"])
def test_triton_path_matches_w8a8_reference_in_the_interpreter(tmp_path, fmt):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, str(tmp_path / "ck"), fmt], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resident_fp8_linear_on_gpu(tmp_path):
    from core_runner.kernels.fp8_block_matmul import fp8_block_linear_ref

    _write(tmp_path, BLOCK_QC)
    quant = quantization_from_config(type("C", (), {"quantization_config": BLOCK_QC})())
    with building_for(quant), torch.device("cuda"):
        model = Tiny()
    load_weights(model, tmp_path, quantization=quant)
    x = torch.randn(7, 32, device="cuda", dtype=torch.bfloat16)
    y = model.qkv(x)
    ref = fp8_block_linear_ref(x.float(), model.qkv.weight, model.qkv.weight_scale_inv, (16, 16))
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("vocab", "resident"), [(64, True), (72, False)])
def test_lm_head_rank_keeps_fp8_rows_only_on_block_boundaries(tmp_path, vocab, resident):
    """A ParallelLMHead split over two ranks: each rank's vocabulary rows keep their fp8 values
    and scales when they cover whole blocks of 16 (vocab 64: rows 0-31 and 32-63), else the
    head goes dense (vocab 72: rows 0-35 and 36-71 cut blocks); either way each rank holds the
    dequantized checkpoint rows, and padding rows are zero."""
    from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group
    from core_runner.layers import ParallelLMHead, is_fp8

    g = torch.Generator().manual_seed(3)
    w = torch.randn(vocab, 32, generator=g)
    q, s = quantize_fp8_block(w, (16, 16))
    tmp_path.mkdir(exist_ok=True)
    save_file({"head.weight": q, "head.weight_scale_inv": s}, str(tmp_path / "model.safetensors"))
    full = dense_weight(type("M", (), {"weight": q, "fp8_block": (16, 16), "weight_scale_inv": s,
                                       "dense_dtype": torch.float32})())
    quant = quantization_from_config(type("C", (), {"quantization_config": BLOCK_QC})())
    for rank in range(2):
        prev = set_tp_group(GroupCoordinator(rank=rank, world_size=2))
        try:
            with building_for(quant):
                model = nn.Module()
                model.head = ParallelLMHead(vocab, 32)
        finally:
            set_tp_group(prev)
        load_weights(model, tmp_path, quantization=quant)
        head = model.head
        assert is_fp8(head) == resident, (rank, vocab)
        mine = head.end - head.start
        got = dense_weight(head, torch.float32)
        torch.testing.assert_close(got[:mine], full[head.start:head.end], rtol=0, atol=0)
        assert not got[mine:].any()
