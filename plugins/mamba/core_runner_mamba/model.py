"""Mamba2ForCausalLM from core_runner.layers: an attention-free stack of Mamba2 blocks
(RMSNorm, then the Mamba2 mixer, added to the residual), a final RMSNorm and the LM head
(tied to the embedding or not). Every cache is per-row recurrent state (the mixers'
``RowStateSpec``): the model has no paged KV cache, so the engine keeps no KV pool for it.

As transformers' ``Mamba2Block``, the residual stream stays in float32 when
``residual_in_fp32`` (the default) and each block normalises it cast to the model dtype;
the gated RMSNorm of each mixer normalises per group of ``d_inner / n_groups`` channels
(mamba_ssm's ``RMSNormGated(group_size=d_ssm // ngroups)`` and transformers >= 5.24;
5.17 normalised over all of d_inner, which differs for n_groups > 1).

Under tensor parallelism each rank keeps 1/tp of the Mamba heads (B and C split by groups
or replicated, see ``Mamba2Mixer``) and of the vocabulary; out_proj all-reduces."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import Mamba2Mixer, ParallelLMHead, RMSNorm, VocabParallelEmbedding


class Mamba2Block(nn.Module):
    """HF ``Mamba2Block``: residual + mixer(norm(x)); returns the next residual stream."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        h = config.hidden_size
        self.norm = RMSNorm(h, config.layer_norm_epsilon)
        self.mixer = Mamba2Mixer(
            h, num_heads=config.num_heads, head_dim=config.head_dim, d_state=config.state_size,
            n_groups=config.n_groups, d_conv=config.conv_kernel, expand_size=int(config.expand * h),
            chunk_size=config.chunk_size, conv_bias=bool(config.use_conv_bias), proj_bias=bool(config.use_bias),
            norm_eps=config.layer_norm_epsilon, activation=config.hidden_act,
            dt_limit=tuple(getattr(config, "time_step_limit", None) or (0.0, float("inf"))),
        )
        self.residual_in_fp32 = bool(getattr(config, "residual_in_fp32", True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.mixer(self.norm(x.to(self.norm.weight.dtype)))
        return (x.float() if self.residual_in_fp32 else x) + h


class Mamba2Model(nn.Module):
    """HF ``Mamba2Model`` (``backbone``): embeddings, blocks, norm_f."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Mamba2Block(config) for _ in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm_f(x)


class Mamba2ForCausalLM(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.backbone = Mamba2Model(config)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size,
                                      self.backbone.embeddings if tied else None)
        self.ignored_weight_patterns = (r"^lm_head\.weight$",) if tied else ()

    @staticmethod
    def map_weight_name(name: str) -> str:
        # mamba_ssm checkpoints name the embedding ``embedding`` (transformers' load_hook renames it too)
        return name.replace("backbone.embedding.", "backbone.embeddings.")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # positions are unused: the recurrence carries order (no position embedding)
        return self.backbone(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # the embedding holds the model dtype (an fp8 head's weight does not)
        return self.lm_head(hidden.to(self.backbone.embeddings.weight.dtype))
