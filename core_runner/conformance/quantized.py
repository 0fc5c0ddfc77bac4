"""Examples whose config declares fp8 block quantization (DeepSeek-V3's format) are written
the way such checkpoints ship: every projection weight as float8_e4m3fn with its
``weight_scale_inv`` per block; embeddings, norms, the router gate and lm_head stay in
float32. The reference is reloaded with the dequantized weights, so it computes with
exactly the values the plugin must recover from the fp8 checkpoint.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from core_runner.quantization import dequantize_fp8_block, quantize_fp8_block

# kept unquantized, as DeepSeek-V3 ships them (transformers' modules_to_not_convert: lm_head)
UNQUANTIZED = re.compile(r"(embed_tokens|lm_head|norm|layernorm|mlp\.gate)\.weight$")


def compressed_tensors_fp8_config(strategy: str = "channel") -> dict:
    """llm-compressor's FP8_DYNAMIC scheme (per-channel weights, dynamic per-token activations),
    or per-tensor weights with ``strategy="tensor"``, as its config.json spells it."""
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                      "dynamic": True}}}}


def fp8_block_size(config: dict) -> tuple[int, int] | None:
    """The [b0, b1] block of an example's fp8 quantization_config, None without one."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict) or qc.get("quant_method") != "fp8":
        return None
    b0, b1 = qc["weight_block_size"]
    return int(b0), int(b1)


def write_fp8_checkpoint(path: Path, reference_cls: Any, block: tuple[int, int]) -> Any:
    """Rewrite the float32 checkpoint at ``path`` in fp8 blocks; returns the reference model
    reloaded from the dequantized weights."""
    files = sorted(path.glob("*.safetensors"))
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    fp8, dequantized = {}, {}
    for name, w in tensors.items():
        if w.dim() != 2 or not name.endswith(".weight") or UNQUANTIZED.search(name):
            fp8[name] = dequantized[name] = w
            continue
        q, scale = quantize_fp8_block(w, block)
        fp8[name], fp8[name + "_scale_inv"] = q, scale
        dequantized[name] = dequantize_fp8_block(q, scale, block, torch.float32, name)
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
    save_file({k: v.contiguous() for k, v in fp8.items()}, target, metadata={"format": "pt"})
    cfg_file.write_text(json.dumps(cfg, indent=2))
    return reference
