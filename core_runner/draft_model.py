"""The DraftModel contract: a small model that proposes tokens for speculative decoding
from the target model's hidden states (DeepSeek's MTP layers, EAGLE, EAGLE-3).

The runner calls a draft, after every target step, in two kinds of pass:
- a first pass over every token of the step, with the same positions, slots and
  attention metadata as the target: at position p the draft reads the token at p + 1
  (the next prompt token, an accepted proposal or the token just sampled) and the
  target's hidden state at p (``combine_hidden_states`` of it), writes its own KV at p
  and predicts the token at p + 2;
- then k - 1 decode passes, one token per speculating request, each reading the draft's
  own ``hidden_for_next`` and the token it proposed last.

The draft's layers are ordinary ``core_runner.layers`` (their caches are allocated in
the target's block pool, on the same block tables: a rejected proposal's slot is
overwritten like the target's) and run under the target's tensor-parallel group.

A draft is constructed as ``cls(config, target_config, weight_names)``: ``config`` is the
draft checkpoint's config (the target's own for MTP), ``weight_names`` every tensor name
its checkpoint holds, so that a draft creates only the modules it will load and takes
the others (embeddings, LM head) from the target in ``bind_target``, keeping them as
plain attributes so that they are neither loaded nor counted twice.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
from torch import nn


class DraftModel(nn.Module):
    # the width of the hidden state a decode pass reads (``forward``'s second output): the
    # runner sizes the static buffers of the decode passes' CUDA graphs with it
    hidden_size: int

    def aux_hidden_state_layers(self, target_config: Any) -> tuple[int, ...] | None:
        """None: the draft reads the hidden states the target's forward returns. A tuple
        (EAGLE-3): the inputs of these target layers, concatenated on the last dim; the
        target must implement ``set_aux_hidden_state_layers``."""
        return None

    def bind_target(self, target: nn.Module) -> None:
        """Take from the target what the draft checkpoint does not hold (after loading)."""
        return None

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The first pass's hidden input, from the target's states (EAGLE-3 projects them)."""
        return hidden_states

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor, spec_step_idx: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden for ``compute_logits``, hidden the next decode pass reads) per token.
        ``spec_step_idx`` is the pass (0 = the first pass, j = the proposal j + 1): a draft
        with several prediction layers (MTP) picks its layer by it."""

    @abstractmethod
    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        """Logits over the draft's vocabulary, for the pass ``spec_step_idx`` (``forward``'s)."""

    def draft_token_ids(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy proposals as target token ids (EAGLE-3 maps its smaller vocabulary)."""
        return logits.argmax(dim=-1)
