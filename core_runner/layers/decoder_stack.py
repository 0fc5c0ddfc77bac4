"""The standard pre-norm decoder: a layer (norm, attention, norm, MLP, the residual adds
fused into the norms) and the stack (embedding, layers, final norm) that can also hand
out the residual stream entering chosen layers, as EAGLE-3 drafts read it.

Parameter names are the Hugging Face checkpoints' (``embed_tokens``, ``layers.N.
{input_layernorm, self_attn, post_attention_layernorm, mlp}``, ``norm``). Norms and the
residual stream are whole on every rank under tensor parallelism; the embedding splits
the vocabulary.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from core_runner.layers.embedding import VocabParallelEmbedding
from core_runner.layers.norm import RMSNorm


class PreNormDecoderLayer(nn.Module):
    """``forward(positions, x, residual) -> (mlp output, residual)``:
    x + attn(norm(x)), then + mlp(norm(.)), each add deferred to the next norm
    (``RMSNorm(x, residual)`` adds, normalises and returns both). ``input_layernorm=False``
    drops the first norm (EAGLE's first draft layer: its input enters attention as it is)."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float, *,
                 input_layernorm: bool = True) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps) if input_layernorm else None
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x
            if self.input_layernorm is not None:
                x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


def eagle3_default_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 target layers: an early, a middle and a late one."""
    return (2, num_layers // 2, num_layers - 3)


def check_aux_layers(layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """``layers`` as a sorted tuple of ints (vLLM hands the states over in layer order),
    each the index of one of the ``num_layers`` layers; ValueError naming the bad ones."""
    layers = tuple(sorted(int(i) for i in layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux hidden state layers {list(layers)}: {bad} are not layers of a model with "
                         f"num_hidden_layers={num_layers} (expected indices 0..{num_layers - 1})")
    return layers


class DecoderStack(nn.Module):
    """Embedding, ``config.num_hidden_layers`` layers from ``make_layer(config, index)``
    (each ``layer(positions, x, residual) -> (x, residual)``), final RMSNorm.

    ``forward(input_ids, positions)`` returns the final hidden states [T, hidden] or, once
    ``aux_layers`` is set, (hidden, [residual stream entering each listed layer])."""

    def __init__(self, config: Any, make_layer: Callable[[Any, int], nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(make_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # sorted layer indices (see check_aux_layers); empty: return the hidden states alone
        self.aux_layers: tuple[int, ...] = ()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        x, residual = self.embed_tokens(input_ids), None
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:  # decided on the host, so a captured CUDA graph never changes
                aux += [x if residual is None else x + residual] * self.aux_layers.count(i)
            x, residual = layer(positions, x, residual)
        x, _ = self.norm(x, residual)
        return (x, aux) if self.aux_layers else x


class AuxHiddenStates:
    """vLLM's EAGLE-3 target methods, for a causal LM whose ``model`` is a DecoderStack."""

    model: DecoderStack

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """From now on ``forward`` returns (hidden, [residual stream entering each listed
        layer, in layer order]): EAGLE-3's inputs."""
        self.model.aux_layers = check_aux_layers(layers, len(self.model.layers))

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return eagle3_default_layers(len(self.model.layers))
