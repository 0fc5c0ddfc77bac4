"""``--model PATH``: the equivalence checks on a real checkpoint. The reference is the
registration's reference class loaded by transformers from the same directory, in
float32 whatever the engine's dtype (``--dtype``), so it is the ground truth the
tolerances of ``tolerance.py`` are measured against."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from core_runner.conformance.harness import Example, Reference, reference_class
from core_runner.registry import Registration


def checkpoint_architecture(path: str, registrations: list[Registration]) -> str:
    """The architecture in ``path``/config.json that one of ``registrations`` serves."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"--model {path!r}: no config.json there (a checkpoint directory is needed)")
    archs = json.loads(cfg_file.read_text()).get("architectures") or []
    ours = [r.architecture for r in registrations]
    hit = next((a for a in archs if a in ours), None)
    if hit is None:
        raise ValueError(f"--model {path!r} has architectures {archs}; the plugin registers {ours}")
    return hit


class CheckpointReference(Reference):
    """The reference loaded from the checkpoint (no random weights, nothing saved)."""

    def __init__(self, reg: Registration, path: Path) -> None:
        cls = reference_class(reg)
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            self.model = cls.from_pretrained(str(path), dtype=torch.float32).eval()
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self._path = Path(path)  # saved already: ``path`` returns it
        self.registration = reg
        self.example = Example("checkpoint", {})
        self.vocab = int(self.model.config.vocab_size)
        self.max_position = getattr(self.model.config, "max_position_embeddings", None)
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}
        self._greedy: dict[tuple[int, ...], list[int]] = {}
