"""Finding and building a speculative-decoding draft model (``core_runner.draft_model``).

``resolve_draft`` runs once in the driver: it picks the draft registration (the target's
own for "mtp", the draft checkpoint's architecture for "eagle" / "eagle3") and reads the
draft's config; the ``DraftSpec`` travels to every rank in the ``RankSpec``, and
``build_draft`` builds the rank's part under its tensor-parallel group, like the target.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from core_runner.config import EngineConfig
from core_runner.loader import architecture_of, checkpoint_files, load_hf_config, load_weights, resolve_model
from core_runner.quantization import quantization_from_config
from core_runner.registry import DraftRegistration, Registry


@dataclass
class DraftSpec:
    registration: DraftRegistration
    hf_config: Any
    path: str


def resolve_draft(config: EngineConfig, registry: Registry, architecture: str, target_path: str,
                  target_hf_config: Any) -> DraftSpec | None:
    spec = config.speculative_config
    if spec is None or not spec.uses_draft_model:
        return None
    if spec.method == "mtp":
        n = int(getattr(target_hf_config, "num_nextn_predict_layers", 0) or 0)
        if n < 1:
            raise ValueError(f"speculative_config method 'mtp' needs next-token-prediction layers in the target's "
                             f"checkpoint, but its config has num_nextn_predict_layers={n}; use method 'ngram', or "
                             "'eagle' / 'eagle3' with a draft checkpoint")
        return DraftSpec(registry.get_draft(architecture, "mtp"), target_hf_config, target_path)
    path = str(resolve_model(spec.model, None))
    hf_config = load_hf_config(path, served=lambda arch: registry.find_draft(arch, spec.method))
    draft_arch = architecture_of(hf_config)
    return DraftSpec(registry.get_draft(draft_arch, spec.method), hf_config, path)


def _weight_names(path: str) -> frozenset[str]:
    names: set[str] = set()
    for file, listed in checkpoint_files(path).items():
        if listed is not None:
            names.update(listed)
        else:
            with safe_open(str(Path(file)), framework="pt") as f:
                names.update(f.keys())
    return frozenset(names)


def build_draft(draft: DraftSpec, target: nn.Module, target_hf_config: Any, dtype: torch.dtype, device: str,
                load_format: str, seed: int) -> nn.Module:
    """The draft on ``device`` with its checkpoint's weights (random ones for
    load_format="dummy"), sharing with ``target`` what the checkpoint lacks."""
    cls = draft.registration.load_model_class()
    names = frozenset() if load_format == "dummy" else _weight_names(draft.path)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(draft.hf_config, target_hf_config, names)
    finally:
        torch.set_default_dtype(prev)
    if load_format == "dummy":
        from core_runner.loader.dummy import fill_dummy_weights

        fill_dummy_weights(model, seed + 1)
    else:
        load_weights(model, draft.path, quantization=quantization_from_config(draft.hf_config))
    model.bind_target(target)
    layers = model.aux_hidden_state_layers(target_hf_config)
    if layers is not None:
        setter = getattr(target, "set_aux_hidden_state_layers", None)
        if setter is None:
            raise ValueError(f"speculative_config method {draft.registration.method!r}: the draft reads the target's "
                             f"hidden states at layers {list(layers)}, but {type(target).__name__} has no "
                             "set_aux_hidden_state_layers; use method 'eagle' or 'ngram'")
        setter(tuple(layers))
    return model.eval()
