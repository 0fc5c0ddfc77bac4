"""DeepSeek-V3's multi-token-prediction (MTP) layers as a speculative-decoding draft.

The checkpoint holds ``num_nextn_predict_layers`` extra layers after the last decoder
layer, ``model.layers.{N}.`` .. ``model.layers.{N + n - 1}.`` (N = num_hidden_layers). Each
is a full decoder layer (MLA, and MoE like every layer past ``first_k_dense_replace``)
plus ``embed_tokens``, ``enorm``, ``hnorm``, ``eh_proj`` [hidden, 2 * hidden] and a
``shared_head`` (``norm`` and ``head``). At position p, with the token t at p + 1 and
the target's hidden state h_p (its final-normed output, as vLLM feeds it):

    x = eh_proj([enorm(embed(t)) | hnorm(h_p)])          (embed(t) = 0 where p == 0)
    y = x' + residual                                    (the decoder layer's output stream)
    logits = shared_head.head(shared_head.norm(y))

``forward`` returns (shared_head.norm(y), y): the norm is applied inside it, so that the
layer a pass picks is fixed there (also in a captured CUDA graph), and y is the hidden the
next decode pass reads. Pass j runs layer j mod n (vLLM's rule); with n > 1 a later
layer's latent cache holds only what its own passes wrote.

DeepSeek shares the embedding and output head between the MTP layers and the main
model, but its checkpoints store copies: a copy equal to the target's tensor is dropped
after loading (``bind_target``) and the target's module used, as is the target's when
the checkpoint has none. One embedding serves every layer (the first layer's, as in
vLLM); each layer keeps its own head.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from core_runner.layers import ParallelLMHead, ReplicatedLinear, RMSNorm, VocabParallelEmbedding, expert_packed_mapping
from core_runner.sdk import DraftModel
from core_runner_deepseek.model import deepseek_layer

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_OWN = ("enorm", "hnorm", "eh_proj", "shared_head")  # the rest of a layer's tensors are its decoder block's


def _borrow(owner: nn.Module, name: str, module: nn.Module) -> None:
    """Make ``owner.<name>`` the target's ``module`` without registering it: its weights
    are the target's, so they are neither loaded nor counted (nor moved) again."""
    owner._modules.pop(name, None)
    object.__setattr__(owner, name, module)


def _same_weight(mine: nn.Module, theirs: nn.Module) -> bool:
    # a load-time comparison, once per tensor (never in a forward)
    return mine.weight.shape == theirs.weight.shape and bool(torch.equal(mine.weight, theirs.weight))


class SharedHead(nn.Module):
    """A layer's output norm and head (the names are the checkpoint's)."""

    def __init__(self, config: Any, with_head: bool) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = ParallelLMHead(config.vocab_size, config.hidden_size) if with_head else None


class DeepSeekMTPLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, with_head: bool) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = ReplicatedLinear(2 * h, h)
        self.shared_head = SharedHead(config, with_head)
        # the plugin's own layer: MLA with a latent cache, MoE by layer_idx, split like the target's
        self.mtp_block = deepseek_layer(config, layer_idx, version=3,
                                        interleaved_rope=bool(getattr(config, "rope_interleave", True)))

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        x, residual = self.mtp_block(positions, x, None)
        y = x + residual
        return self.shared_head.norm(y), y


class DeepSeekMTP(DraftModel):
    """The MTP layers of a DeepseekV3ForCausalLM checkpoint (see the module docstring)."""

    ignored_weight_patterns = (r"rotary_emb\.inv_freq",)

    def __init__(self, config: Any, target_config: Any, weight_names: frozenset[str]) -> None:
        super().__init__()
        n = int(getattr(config, "num_nextn_predict_layers", 0) or 0)
        if n < 1:
            raise ValueError(f"DeepSeekMTP needs num_nextn_predict_layers >= 1 in the config, got {n}")
        start = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.layer_ids = tuple(str(start + i) for i in range(n))
        if weight_names and not any(name.startswith(f"model.layers.{start}.") for name in weight_names):
            raise ValueError(f"the checkpoint has no tensors of its multi-token-prediction layer "
                             f"'model.layers.{start}.*' (num_hidden_layers={start}, num_nextn_predict_layers={n}): "
                             "it was saved without its MTP layers; speculate with method 'ngram' instead")

        def holds(layer: str, what: str) -> bool:
            return f"model.layers.{layer}.{what}.weight" in weight_names

        # what the checkpoint lacks is the target's (bind_target); a dummy load lists no names
        first = self.layer_ids[0]
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, config.hidden_size)
                             if holds(first, "embed_tokens") else None)
        self.layers = nn.ModuleDict({i: DeepSeekMTPLayer(config, int(i), holds(i, "shared_head.head"))
                                     for i in self.layer_ids})
        # per-expert tensors before the dense / shared MLPs' gate and up (first match wins)
        self.packed_modules_mapping = {
            **expert_packed_mapping(config.n_routed_experts),
            "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
        }

    def map_weight_name(self, name: str) -> str | None:
        """``model.layers.{N + i}.X`` -> this module's name; None for the target's tensors."""
        m = _LAYER.match(name)
        if m is None or m[1] not in self.layers:
            return None
        layer, rest = m[1], m[2]
        part = rest.split(".", 1)[0]
        if part == "embed_tokens":
            # one embedding for every layer: the first layer's copy (or the target's)
            return rest if layer == self.layer_ids[0] and self.embed_tokens is not None else None
        if part in _OWN:
            if rest.startswith("shared_head.head.") and self.layers[layer].shared_head.head is None:
                return None
            return f"layers.{layer}.{rest}"
        return f"layers.{layer}.mtp_block.{rest}"

    def bind_target(self, target: nn.Module) -> None:
        embed, lm_head = target.model.embed_tokens, target.lm_head
        if self.embed_tokens is None or _same_weight(self.embed_tokens, embed):
            _borrow(self, "embed_tokens", embed)
        for layer in self.layers.values():
            head = layer.shared_head.head
            if head is None or _same_weight(head, lm_head):
                _borrow(layer.shared_head, "head", lm_head)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor, spec_step_idx: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = self.embed_tokens(input_ids)
        # zeroed at position 0 as vLLM does ("not needed by MTP"), so proposals match its
        embeds = embeds.masked_fill((positions == 0).unsqueeze(-1), 0.0)
        return self._layer(spec_step_idx)(embeds, positions, hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        return self._layer(spec_step_idx).shared_head.head(hidden_states)

    def _layer(self, spec_step_idx: int) -> nn.Module:
        return self.layers[self.layer_ids[spec_step_idx % len(self.layer_ids)]]  # a host choice: nothing read back
