"""The Qwen3 plugin's model with one planted bug each. The first ones are of the kind the
registered examples hide (they keep rope_theta at 10,000, head_dim at hidden / heads and
positions below 512): CR-EQ-12 and CR-EQ-13 must find them. The last ones break one
module of one layer: CR-EQ-01 fails and its diagnosis must name that module."""
from __future__ import annotations

import copy

import torch
from core_runner_qwen3.model import Qwen3ForCausalLM, Qwen3MLP
from core_runner_qwen3.model_moe import Qwen3MoeForCausalLM

from core_runner.layers import Linear, RotaryEmbedding, rope_theta_of


def _attentions(model: Qwen3ForCausalLM) -> list:
    return [layer.self_attn for layer in model.model.layers]


class HardcodedTheta(Qwen3ForCausalLM):
    """Builds every rotary table with base 10,000, whatever the config says."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for attn in _attentions(self):
            attn.rotary_emb = RotaryEmbedding(attn.head_dim, attn.head_dim, config.max_position_embeddings, 10000.0)


class HeadDimFromHidden(Qwen3ForCausalLM):
    """Takes head_dim as hidden_size / num_attention_heads, ignoring the config's head_dim."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.head_dim = config.hidden_size // config.num_attention_heads
        super().__init__(config)


class CutRotary(RotaryEmbedding):
    """A table of at most 2,048 positions, read without a bounds check (later positions
    get the last row, as an unchecked gather on a GPU would give some row)."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float) -> None:
        super().__init__(head_size, rotary_dim, min(max_position, 2048), base)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return super().forward(positions.clamp(max=self.cos_sin.shape[0] - 1), q, k)


class RopeCutAt2048(Qwen3ForCausalLM):
    def __init__(self, config) -> None:
        super().__init__(config)
        for attn in _attentions(self):
            attn.rotary_emb = CutRotary(attn.head_dim, attn.head_dim, config.max_position_embeddings,
                                        rope_theta_of(config))



class FailsPast2048(Qwen3ForCausalLM):
    """Raises on positions past 2,048 (a kernel's bound check): its requests there end with
    finish_reason "error" and no token, while the logits recorded before the fault match."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor):
        if bool((positions >= 2048).any()):
            raise RuntimeError("position past 2048")
        return super().forward(input_ids, positions)


class ScaledMLP(Qwen3MLP):
    """Scales a correct MLP's output: wrong at the MLP itself, not inside it (its down_proj
    still matches the reference), so the diagnosis must name the MLP."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 1.25


class LayerOneMLPScaled(Qwen3ForCausalLM):
    """Layer 1's MLP output is scaled by 1.25; layer 0 and layer 1's attention are right."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.model.layers[1].mlp = ScaledMLP(config.hidden_size, config.intermediate_size)


class BiasedRouter(Linear):
    """A router whose logits favour expert 0: routes (and weights) tokens wrongly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits + torch.nn.functional.one_hot(torch.zeros_like(logits[:, 0], dtype=torch.long),
                                                    logits.shape[-1]).to(logits.dtype) * 2.0


class LayerTwoRouterBiased(Qwen3MoeForCausalLM):
    """Layer 2's router (``model.layers.2.mlp.gate``, the second sparse layer of the tiny
    MoE example) is biased; layer 0's router and everything before layer 2's MLP are right."""

    def __init__(self, config) -> None:
        super().__init__(config)
        moe = self.model.layers[2].mlp
        moe.gate = BiasedRouter(config.hidden_size, config.num_experts)
