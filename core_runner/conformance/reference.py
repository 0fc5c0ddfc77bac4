"""The reference side of every check: examples, the registration's reference class built
from an example's tiny config (float32, every tensor moved off its init value), saved as a
checkpoint the engine loads, and its logits / hidden states / greedy continuations computed
one prompt at a time with an explicit all-ones attention mask (no cache to trust)."""
from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core_runner.conformance.quantized import fp8_block_size, write_fp8_checkpoint
from core_runner.conformance.tokenizer import write_tokenizer
from core_runner.registry import Registration, import_string

DEFAULT_INIT_RANGE = 0.15  # wider than HF's 0.02: no near-ties, varied greedy continuations


@dataclass(frozen=True)
class Example:
    name: str
    config: dict


def examples_of(reg: Registration) -> list[Example]:
    """A registration's examples: ``{"name": ..., "config": {...}}`` or bare config dicts."""
    out = []
    for i, ex in enumerate(reg.examples):
        if not isinstance(ex, dict):
            raise ValueError(f"{reg.architecture}: example {i} is {type(ex).__name__}, expected a dict")
        if "config" in ex:
            name, cfg = ex.get("name") or f"example{i}", ex["config"]
        else:
            name, cfg = f"example{i}", ex
        if not isinstance(cfg, dict):
            raise ValueError(f"{reg.architecture}: example {name!r} has a config of type {type(cfg).__name__}")
        out.append(Example(str(name), dict(cfg)))
    return out


def reference_class(reg: Registration) -> Any:
    if not reg.reference:
        raise ValueError(f"{reg.architecture} names no reference class (registry.add(..., reference='transformers:X'))")
    return import_string(reg.reference, f"reference of {reg.architecture} (plugin {reg.plugin!r})")


def reference_config(reg: Registration, example: Example) -> Any:
    cls = reference_class(reg)
    config_cls = getattr(cls, "config_class", None)
    if config_cls is None:
        raise ValueError(f"reference {reg.reference} has no config_class: cannot build it from an example config")
    cfg = {k: v for k, v in example.config.items() if k != "architectures"}
    defaults = {"initializer_range": DEFAULT_INIT_RANGE, "eos_token_id": None, "bos_token_id": None,
                "pad_token_id": None}
    for k, v in defaults.items():
        cfg.setdefault(k, v)
    return config_cls(**cfg)


PERTURB_CONSTANT = 0.2  # noise added to a tensor that holds one value (zero biases, unit norms, D = 1)
PERTURB_RELATIVE = 0.1  # jitter, in units of its own spread, of every other tensor (A_log = log(1..n) ...)


def randomize_every_tensor(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Give every float parameter and saved buffer values no initialiser would give it:
    a tensor that transformers fills with one value (zero biases, unit norms, a zero
    ``e_score_correction_bias``, ``D`` = 1) would let a model that ignores it, or uses it
    in the wrong place, pass; a deterministic one (``A_log`` = log(1..n)) would let a model
    that rebuilds it from the config pass. Buffers that are not saved (rotary tables) are
    derived from the config by both sides and stay as they are."""
    saved = set(model.state_dict().keys())
    seen: set[int] = set()
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name not in saved or not t.is_floating_point() or t.numel() == 0 or id(t) in seen:
                continue
            seen.add(id(t))
            flat = t.reshape(-1)
            noise = torch.randn(t.shape, generator=gen)
            if bool((flat == flat[0]).all()):
                t.add_(noise * PERTURB_CONSTANT)
            else:
                t.add_(noise * PERTURB_RELATIVE * float(flat.float().std()))


def unchanged_tensors(model: torch.nn.Module) -> list[str]:
    """Saved float tensors that still hold a single value (what ``randomize_every_tensor`` must leave none of)."""
    out = []
    for name, t in model.state_dict().items():
        flat = t.reshape(-1)
        if t.is_floating_point() and flat.numel() > 0 and bool((flat == flat[0]).all()):
            out.append(name)
    return out


def _first_names(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the second name of a tied tensor."""
    out, seen = {}, set()
    for k, v in model.state_dict().items():
        if v.data_ptr() not in seen:
            out[k] = v
        seen.add(v.data_ptr())
    return out


def _shared_tensors(src: torch.nn.Module, dst: torch.nn.Module) -> dict[str, torch.Tensor]:
    """src's tensors that dst has under the same name and shape; a tied tensor is taken once on
    either side, so untying gives the head weights of its own and tying keeps the embedding."""
    mine = _first_names(dst)
    return {k: v for k, v in _first_names(src).items() if k in mine and mine[k].shape == v.shape}


class Reference:
    """One (registration, example): the reference model, saved as a checkpoint the engine
    loads (on first use of ``path``). ``like`` is another Reference whose tensors this one
    takes wherever the names and shapes agree, so a derived example (a perturbed config
    field) differs from its base by the field alone, not by a new draw of every weight."""

    def __init__(self, reg: Registration, example: Example, root: Path, seed: int = 0,
                 like: "Reference | None" = None) -> None:
        cls = reference_class(reg)
        hf_config = reference_config(reg, example)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            torch.manual_seed(seed)
            model = cls(hf_config).to(torch.float32).eval()
        finally:
            torch.set_default_dtype(prev)
        randomize_every_tensor(model, torch.Generator().manual_seed(seed + 1))
        if like is not None:
            model.load_state_dict(_shared_tensors(like.model, model), strict=False)
        self.model = model
        self.registration = reg
        self.example = example
        self.vocab = int(hf_config.vocab_size)
        self.max_position = getattr(hf_config, "max_position_embeddings", None)
        self._root = Path(root)
        self._path: Path | None = None
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}
        self._greedy: dict[tuple[int, ...], list[int]] = {}
        if fp8_block_size(example.config) is not None:
            _ = self.path  # the reference computes with the dequantized weights of its fp8 checkpoint

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = self._save()
        return self._path

    def tokenizer(self) -> Any | None:
        """The checkpoint's tokenizer as transformers loads it (None: the checkpoint has none)."""
        if not hasattr(self, "_tokenizer"):
            from core_runner.loader.config import load_tokenizer

            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    def _save(self) -> Path:
        reg, example = self.registration, self.example
        safe = re.sub(r"[^A-Za-z0-9_.=~+-]+", "_", example.name)[:120]
        path = self._root / f"{reg.architecture}-{safe}"
        from transformers.utils import logging as hf_logging

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            self.model.save_pretrained(str(path))
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        cfg_file = path / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["architectures"] = [reg.architecture]  # the engine picks the plugin by this name
        cfg_file.write_text(json.dumps(cfg, indent=2))
        # text for the checks that need it (score pairs, grammars); the same files for both sides
        self.has_tokenizer = write_tokenizer(path, self.model.config)
        block = fp8_block_size(example.config)
        if block is not None:
            self.model = write_fp8_checkpoint(path, reference_class(reg), block)
        return path

    def with_checkpoint(self, model: torch.nn.Module, path: Path) -> "Reference":
        """This example's reference for another checkpoint of it (a quantized copy, CR-EQ-18):
        ``model`` computes the logits, ``path`` is what the engine loads; nothing is cached yet."""
        other = copy.copy(self)
        other.model, other._path, other._logits, other._greedy = model, Path(path), {}, {}
        return other

    def remove(self) -> None:
        """Delete the checkpoint (derived examples are many; their directories need not stay)."""
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None

    def _forward(self, seq: list[int]) -> torch.Tensor:
        ids = torch.tensor([seq], dtype=torch.long)
        with torch.no_grad():
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()

    def hidden(self, seq: list[int]) -> torch.Tensor:
        """[len(seq), hidden]: the reference's final hidden states (embedding models)."""
        ids = torch.tensor([seq], dtype=torch.long)
        with torch.no_grad():
            return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0].float()

    def class_logits(self, seq: list[int]) -> torch.Tensor:
        """[num_labels]: a sequence classifier's logits for the prompt (batch 1, no padding)."""
        key = ("class", *seq)
        if key not in self._logits:
            self._logits[key] = self._forward(list(seq))
        return self._logits[key]

    def logits(self, seq: list[int]) -> torch.Tensor:
        """[len(seq), vocab]: row i predicts token i + 1."""
        key = tuple(seq)
        if key not in self._logits:
            self._logits[key] = self._forward(list(seq))
        return self._logits[key]

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        key = tuple(prompt)
        have = self._greedy.setdefault(key, [])
        seq = list(prompt) + have
        while len(have) < n:
            tok = int(self._forward(seq)[-1].argmax())
            have.append(tok)
            seq.append(tok)
        return have[:n]

    def prompts(self, lengths: list[int], seed: int) -> list[list[int]]:
        """Random prompts with ids in [3, vocab) (clear of typical special ids)."""
        g = torch.Generator().manual_seed(seed)
        return [torch.randint(3, self.vocab, (n,), generator=g).tolist() for n in lengths]
