"""fp8 checkpoints written by the suite, in the layouts the hub ships them.

Schemes (``SCHEMES``, each under the capability that declares it):

- ``fp8-block`` (``quantization:fp8``, DeepSeek-V3 / Qwen3-*-FP8): every projection weight
  float8_e4m3fn with its ``weight_scale_inv`` per [b0, b1] block;
- ``ct-tensor`` / ``ct-channel`` (``quantization:compressed-tensors``, llm-compressor's FP8
  and FP8_DYNAMIC): ``weight`` float8_e4m3fn with ``weight_scale`` per tensor ([1]) or per
  output channel ([out, 1]), scales and values computed by the compressed-tensors library
  itself (``calculate_qparams`` / ``quantize``), its ``QuantizationConfig`` dumped into
  config.json as llm-compressor writes it.

What is quantized: every 2-dim ``.weight`` except embeddings, norms, routers and lm_head
(``UNQUANTIZED``; DeepSeek-V3 and llm-compressor's recipes leave those dense); with block
fp8 also stacked expert tensors (3-dim, gpt-oss's layout; blocks over each expert's
matrix), which compressed-tensors, targeting Linear modules, leaves dense. The reference is reloaded with the
dequantized weights, so it computes with exactly the values the plugin must recover.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from core_runner.quantization import dequantize_fp8_block, quantize_fp8_block

# kept unquantized, as the published fp8 checkpoints ship them (transformers'
# modules_to_not_convert: lm_head; llm-compressor's ignore: lm_head and the MoE routers)
UNQUANTIZED = re.compile(r"(embed_tokens|embeddings|embedding|wte|lm_head|norm|layernorm|mlp\.gate|router)\.weight$")
# Hugging Face's stacked expert tensors [experts, in, out] (gpt-oss)
STACKED_EXPERTS = re.compile(r"experts\.(gate_up_proj|down_proj)$")
# scheme -> the capability that declares it
SCHEMES = {"fp8-block": "quantization:fp8", "ct-tensor": "quantization:compressed-tensors",
           "ct-channel": "quantization:compressed-tensors"}
BLOCK = (16, 16)  # the examples' block: the published [128, 128] shrunk with their sizes


def compressed_tensors_fp8_config(strategy: str = "channel", ignore: list[str] | None = None) -> dict:
    """llm-compressor's FP8_DYNAMIC scheme (per-channel weights, dynamic per-token activations),
    or per-tensor weights with ``strategy="tensor"``, as its config.json spells it."""
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": list(ignore or ["lm_head"]), "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                      "dynamic": True}}}}


def fp8_block_config(block: tuple[int, int] = BLOCK) -> dict:
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block)}


def fp8_block_size(config: dict) -> tuple[int, int] | None:
    """The [b0, b1] block of an example's fp8 quantization_config, None without one."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "fp8":
        return None
    b0, b1 = qc["weight_block_size"]
    return int(b0), int(b1)


def is_quantized_name(name: str, w: torch.Tensor, scheme: str = "fp8-block", keep: re.Pattern = UNQUANTIZED) -> bool:
    """Whether ``scheme`` stores checkpoint tensor ``name`` in fp8: a projection's 2-dim weight
    not matched by ``keep``; for block fp8 also stacked experts (3-dim, one block grid per
    expert), which compressed-tensors (targets: Linear) leaves dense."""
    if not w.is_floating_point() or keep.search(name):
        return False
    if w.dim() == 3 and scheme == "fp8-block":
        return STACKED_EXPERTS.search(name) is not None
    return w.dim() == 2 and name.endswith(".weight")


def _ct_quantize(w: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 values, weight_scale, dequantized float32) through the compressed-tensors library."""
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = QuantizationConfig.model_validate(compressed_tensors_fp8_config(strategy)).config_groups["group_0"].weights
    w = w.float()
    if strategy == "tensor":
        lo, hi = w.amin().reshape(1), w.amax().reshape(1)
    else:
        lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    scale, zero = calculate_qparams(lo, hi, args)
    q = quantize(w, scale, zero, args, dtype=args.pytorch_dtype())
    return q, scale.float(), dequantize(q, scale, zero, args, dtype=torch.float32)


def quantize_tensors(tensors: dict[str, torch.Tensor], scheme: str, block: tuple[int, int] = BLOCK,
                     keep: re.Pattern = UNQUANTIZED) -> tuple[dict, dict, list[str]]:
    """(the checkpoint's tensors, the dequantized ones for the reference, the quantized names);
    ``keep``: the names left unquantized."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme {scheme!r} is unknown: expected one of {sorted(SCHEMES)}")
    stored, dequantized, names = {}, {}, []
    for name, w in tensors.items():
        if not is_quantized_name(name, w, scheme, keep):
            stored[name] = dequantized[name] = w
            continue
        names.append(name)
        if scheme == "fp8-block":
            q, scale = quantize_fp8_block(w, block)
            stored[name], stored[name + "_scale_inv"] = q, scale
            dequantized[name] = dequantize_fp8_block(q, scale, block, torch.float32, name)
        else:
            q, scale, deq = _ct_quantize(w, scheme.removeprefix("ct-"))
            stored[name], stored[name + "_scale"] = q, scale
            dequantized[name] = deq
    return stored, dequantized, names


def scheme_config(scheme: str, block: tuple[int, int] = BLOCK) -> dict:
    """config.json's quantization_config for ``scheme``; compressed-tensors' through its
    library's QuantizationConfig, with ``ignore`` naming the Linear modules left dense."""
    if scheme == "fp8-block":
        return fp8_block_config(block)
    from compressed_tensors.quantization import QuantizationConfig

    ignore = ["lm_head", "re:.*mlp\\.gate$", "re:.*router$"]
    qc = QuantizationConfig.model_validate(compressed_tensors_fp8_config(scheme.removeprefix("ct-"), ignore))
    return {"quant_method": "compressed-tensors", **qc.model_dump(mode="json", exclude={"quant_method"})}


def _read_all(path: Path) -> tuple[list[Path], dict[str, torch.Tensor]]:
    files = sorted(path.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    return files, tensors


def write_quantized_checkpoint(src: Path, dst: Path, reference_cls: Any, scheme: str, block: tuple[int, int] = BLOCK,
                               keep: re.Pattern = UNQUANTIZED) -> tuple[Any, list[str]]:
    """Write ``src`` (a float32 checkpoint) quantized with ``scheme`` into ``dst``; returns the
    reference model loaded from the dequantized weights (None without ``reference_cls``) and
    the names that were quantized."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    _, tensors = _read_all(src)
    stored, dequantized, names = quantize_tensors(tensors, scheme, block, keep)
    cfg_file = dst / "config.json"
    cfg = {k: v for k, v in json.loads(cfg_file.read_text()).items() if k != "quantization_config"}
    target = str(dst / "model.safetensors")
    reference = None
    if reference_cls is not None:
        save_file({k: v.contiguous() for k, v in dequantized.items()}, target, metadata={"format": "pt"})
        cfg_file.write_text(json.dumps(cfg, indent=2))
        reference = reference_cls.from_pretrained(str(dst), dtype=torch.float32).eval()
    save_file({k: v.contiguous() for k, v in stored.items()}, target, metadata={"format": "pt"})
    cfg_file.write_text(json.dumps({**cfg, "quantization_config": scheme_config(scheme, block)}, indent=2))
    return reference, names


def write_fp8_checkpoint(path: Path, reference_cls: Any, block: tuple[int, int]) -> Any:
    """Rewrite the float32 checkpoint at ``path`` in fp8 blocks, keeping its own
    quantization_config; returns the reference model reloaded from the dequantized weights."""
    files, tensors = _read_all(path)
    stored, dequantized, _ = quantize_tensors(tensors, "fp8-block", block)
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
    for file in files:
        file.unlink()
    target = str(path / "model.safetensors")
    # the reference reads the dequantized values through transformers' own loading
    save_file({k: v.contiguous() for k, v in dequantized.items()}, target, metadata={"format": "pt"})
    cfg_file.write_text(json.dumps(plain, indent=2))
    reference = reference_cls.from_pretrained(str(path), dtype=torch.float32).eval()
    save_file({k: v.contiguous() for k, v in stored.items()}, target, metadata={"format": "pt"})
    cfg_file.write_text(json.dumps(cfg, indent=2))
    return reference
