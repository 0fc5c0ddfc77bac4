"""Checkpoint loading: HF config, safetensors weights mapped onto model parameters.

Parameters carry a ``weight_loader(param, tensor, shard_id=None)``. A model may declare
``packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), ...}`` to route checkpoint
tensors into fused parameters, and ``ignored_weight_patterns`` for checkpoint tensors
it does not use. Any parameter left unloaded is an error.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from core_runner.quantization import Quantization, TensorLookup, quantization_from_config

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_hf_config(path: str | Path) -> Any:
    """The checkpoint's config as a transformers config object (or a plain namespace)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"model={str(path)!r}: no config.json there (expected a Hugging Face checkpoint directory)"
        )
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(path))
    except (ValueError, KeyError):
        from transformers import PretrainedConfig

        return PretrainedConfig(**json.loads(cfg_file.read_text()))


def architecture_of(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None) or []
    if not archs:
        raise ValueError("config.json has no 'architectures' entry: cannot choose a plugin")
    return archs[0]


def resolve_dtype(name: str, hf_config: Any, device: str) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    declared = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(declared, torch.dtype):
        declared = str(declared).removeprefix("torch.")
    if device == "cpu":
        return torch.float32
    return _DTYPES.get(str(declared), torch.bfloat16)


def eos_token_ids(path: str | Path, hf_config: Any) -> tuple[int, ...]:
    gen = Path(path) / "generation_config.json"
    eos = None
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def load_weights(model: nn.Module, path: str | Path, quantization: Quantization | None = None) -> None:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(path)!r}")
    params = dict(model.named_parameters())
    packed: dict[str, tuple[str, object]] = getattr(model, "packed_modules_mapping", {})
    ignored = [re.compile(p) for p in getattr(model, "ignored_weight_patterns", ())]
    rename = getattr(model, "map_weight_name", None)
    loaded: set[str] = set()
    lookup = TensorLookup(files)  # [quantization hook] scales may sit in another shard
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if quantization is not None and quantization.is_auxiliary(name):  # [quantization hook]
                    continue  # scales are read with their weight by quantization.prepare
                target = rename(name) if rename else name
                if target is None or any(p.search(target) for p in ignored):
                    continue
                shard = None
                for src, (dst, shard_id) in packed.items():
                    if f".{src}." in f".{target}":
                        target = f".{target}".replace(f".{src}.", f".{dst}.")[1:]
                        shard = shard_id
                        break
                param = params.get(target)
                if param is None:
                    raise ValueError(
                        f"checkpoint tensor {name!r} (mapped to {target!r}) has no parameter in "
                        f"{type(model).__name__}; add it to ignored_weight_patterns if it is unused"
                    )
                loader = getattr(param, "weight_loader", None)
                tensor = f.get_tensor(name)
                if quantization is not None:  # [quantization hook] fp8 weight -> param dtype
                    tensor = quantization.prepare(name, tensor, lookup, param.dtype)
                if loader is None:
                    if param.shape != tensor.shape:
                        raise ValueError(f"{name!r}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                    param.data.copy_(tensor.to(param.dtype))
                elif shard is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard)
                loaded.add(target if shard is None else f"{target}#{shard}")
    loaded_params = {n.split("#")[0] for n in loaded}
    missing = [n for n in params if n not in loaded_params]
    if missing:
        raise ValueError(f"parameters not found in the checkpoint {str(path)!r}: {missing[:8]}"
                         f"{' ...' if len(missing) > 8 else ''}")


def build_model(model_cls: type, hf_config: Any, dtype: torch.dtype, device: str, path: str | Path) -> nn.Module:
    quantization = quantization_from_config(hf_config)  # [quantization hook] refuse before allocating
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(hf_config)
    finally:
        torch.set_default_dtype(prev)
    load_weights(model, path, quantization)
    return model.eval()


def load_tokenizer(path: str | Path) -> Any | None:
    p = Path(path)
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(p))
