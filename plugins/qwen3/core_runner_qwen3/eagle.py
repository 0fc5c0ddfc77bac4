"""EAGLE and EAGLE-3 draft models for speculative decoding (``core_runner.sdk.DraftModel``),
loading the published checkpoints as vLLM's llama_eagle.py / llama_eagle3.py do.

Why they live in the Qwen3 plugin: an EAGLE draft is made of Llama decoder layers whatever
its target (the published EAGLE-3 drafts for Qwen3 targets are ``LlamaForCausalLMEagle3``
checkpoints too), and it is chosen by its own checkpoint's architecture, not by the
target's family. One installed plugin has to register them; the Qwen3 plugin is the
built-in family made of such layers, while the template plugin is a minimal example of a
third-party plugin and stays one. Any target that returns its hidden states (EAGLE) or
implements ``set_aux_hidden_state_layers`` (EAGLE-3) can use them.

EAGLE (yuhuili/EAGLE-LLaMA3-Instruct-8B): at position p, with the target's hidden state
h_p and the next token t,
    x = fc([embed(t); h_p])                  fc: [H, 2H], a bias in the original checkpoints
    x, r = Llama decoder layers (x)          the first one without input_layernorm
    out = x + r                              no final norm
forward returns (out, out); logits are the target's LM head of out.

EAGLE-3 (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B): the first pass's hidden input is
fc(concat of the target's residual stream entering layers l1, l2, l3) (fc: [H, 3 H_target]);
then
    x = [input_layernorm(embed(t)); hidden_norm(h)]      2H wide, residual r = h
    x, r = post_attention_layernorm(attention(x), r)      q/k/v read the 2H input
    (normed, prenorm) = norm(mlp(x), r)
forward returns (normed, prenorm); logits are over the draft's own (smaller) vocabulary,
and draft id d is target id d + d2t[d].
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    DecoderAttention,
    Linear,
    ParallelLMHead,
    RMSNorm,
    VocabParallelEmbedding,
    eagle3_default_layers,
)
from core_runner.sdk import DraftModel
from core_runner_qwen3.model import Qwen3DecoderLayer, Qwen3MLP

PACKED = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


def checkpoint_name(name: str) -> str:
    """A draft checkpoint's tensor name as this module names it: with or without the
    ``model.`` prefix, EAGLE-3's ``midlayer`` being layer 0."""
    name = name.removeprefix("model.")
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def check_llama_draft(config: Any, method: str) -> None:
    """Refuse what these layers do not implement, rather than run it wrong."""
    act = getattr(config, "hidden_act", "silu") or "silu"
    if act != "silu":
        raise ValueError(f"{method} draft: hidden_act={act!r} is not supported, only 'silu'")
    if getattr(config, "mlp_bias", False):
        raise ValueError(f"{method} draft: mlp_bias=True is not supported")
    if getattr(config, "add_para_norm", False):
        raise ValueError(f"{method} draft: add_para_norm=True (HASS's extra norms) is not supported")


def shared_module(target: nn.Module, paths: tuple[str, ...], what: str) -> nn.Module:
    """The target's module at the first of ``paths`` it has, for a part the draft
    checkpoint lacks."""
    for path in paths:
        module: Any = target
        for attr in path.split("."):
            module = getattr(module, attr, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(f"the draft checkpoint has no {what}, so the draft shares the target's, but "
                     f"{type(target).__name__} has none of {list(paths)}")


def share(draft: nn.Module, name: str, module: nn.Module, width: int) -> None:
    """Keep a target module as a plain attribute: not a parameter of the draft, so it is
    neither loaded nor counted twice."""
    got = getattr(module, "embedding_dim", width)
    if got != width:
        raise ValueError(f"the draft's hidden size is {width} but the target's {name} is {got} wide: the draft "
                         f"checkpoint must carry its own {name}")
    object.__setattr__(draft, name, module)


def llama_attention(config: Any, max_position: int, input_size: int | None = None) -> DecoderAttention:
    """Llama attention (RoPE, no q/k norm); q/k/v read ``input_size`` features (2H in
    EAGLE-3's first layer); heads split over tensor-parallel ranks like the target's."""
    return DecoderAttention(config, input_size=input_size, max_position=max_position)


def llama_draft_layer(config: Any, max_position: int, input_layernorm: bool = True) -> Qwen3DecoderLayer:
    """A pre-norm Llama decoder layer; without ``input_layernorm`` (EAGLE's first layer,
    after the original cnets.py) its input enters attention as it is."""
    return Qwen3DecoderLayer(config, attn=llama_attention(config, max_position), input_layernorm=input_layernorm)


class Eagle3FirstLayer(nn.Module):
    """EAGLE-3's ``midlayer``: attention over [normed embedding; normed hidden state]."""

    def __init__(self, config: Any, max_position: int) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = llama_attention(config, max_position, 2 * h)
        self.mlp = Qwen3MLP(h, config.intermediate_size)
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        # some trainers (vLLM's norm_before_residual) carry the normed hidden state as the residual
        self.norm_before_residual = bool(getattr(config, "norm_before_residual", False))

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor,
                hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = self.self_attn(positions, torch.cat([self.input_layernorm(embeds), normed], dim=-1))
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class _LlamaDraft(DraftModel):
    """What both drafts share: checkpoint names, an embedding (the checkpoint's or the
    target's) and the layers' positions table, as long as the target's."""

    packed_modules_mapping = PACKED
    ignored_weight_patterns: tuple[str, ...] = (r"rotary_emb\.inv_freq",)
    method = ""

    def __init__(self, config: Any, target_config: Any, weight_names: frozenset[str]) -> None:
        super().__init__()
        check_llama_draft(config, self.method)
        self.config = config
        self.names = frozenset(checkpoint_name(n) for n in weight_names)
        self.hidden_size = config.hidden_size
        # the draft runs at the target's positions, which may go past the draft config's length
        self.max_position = max(int(getattr(c, "max_position_embeddings", 0) or 0) for c in (config, target_config))
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, self.hidden_size)
                             if "embed_tokens.weight" in self.names else None)

    def map_weight_name(self, name: str) -> str:
        return checkpoint_name(name)

    def bind_target(self, target: nn.Module) -> None:
        if self.embed_tokens is None:
            embed = shared_module(target, ("model.embed_tokens", "embed_tokens"), "embed_tokens.weight")
            share(self, "embed_tokens", embed, self.hidden_size)


class EagleLlamaForCausalLM(_LlamaDraft):
    """EAGLE-1 (see the module docstring); the LM head is the target's unless the
    checkpoint carries one."""

    method = "eagle"
    # EAGLE's first layer has no input norm; a converted checkpoint may still carry one
    ignored_weight_patterns = (*_LlamaDraft.ignored_weight_patterns, r"^layers\.0\.input_layernorm\.weight$")

    def __init__(self, config: Any, target_config: Any, weight_names: frozenset[str]) -> None:
        super().__init__(config, target_config, weight_names)
        h = self.hidden_size
        if target_config.hidden_size != h:
            raise ValueError(f"eagle draft: hidden_size={h} differs from the target's {target_config.hidden_size}; "
                             "an EAGLE draft reads the target's hidden states as they are")
        self.fc = Linear(2 * h, h, bias="fc.bias" in self.names)
        self.layers = nn.ModuleList(llama_draft_layer(config, self.max_position, input_layernorm=i > 0)
                                    for i in range(config.num_hidden_layers))
        self.lm_head = ParallelLMHead(config.vocab_size, h) if "lm_head.weight" in self.names else None

    def bind_target(self, target: nn.Module) -> None:
        super().bind_target(target)
        if self.lm_head is None:
            share(self, "lm_head", shared_module(target, ("lm_head",), "lm_head.weight"), self.hidden_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                spec_step_idx: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat([self.embed_tokens(input_ids), hidden_states], dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        x = x + residual
        return x, x

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        return self.lm_head(hidden_states)


class Eagle3LlamaForCausalLM(_LlamaDraft):
    """EAGLE-3 (see the module docstring). The target layers it reads come from the draft
    config's ``eagle_config["eagle_aux_hidden_state_layer_ids"]``, else vLLM's default
    (2, L // 2, L - 3); with ``eagle_config["use_aux_hidden_state"]`` false it reads the
    target's final hidden states and has no fc."""

    method = "eagle3"
    ignored_weight_patterns = (*_LlamaDraft.ignored_weight_patterns, r"^t2d$")

    def __init__(self, config: Any, target_config: Any, weight_names: frozenset[str]) -> None:
        super().__init__(config, target_config, weight_names)
        h = self.hidden_size
        eagle = getattr(config, "eagle_config", None) or {}
        self.use_aux = bool(eagle.get("use_aux_hidden_state", True))
        target_h = getattr(config, "target_hidden_size", None) or target_config.hidden_size
        if self.use_aux:
            n = len(self.aux_hidden_state_layers(target_config))
            self.fc = Linear(n * target_h, h, bias="fc.bias" in self.names)
        elif target_h != h:
            raise ValueError(f"eagle3 draft without aux hidden states: hidden_size={h} differs from the target's "
                             f"{target_h}")
        self.layers = nn.ModuleList([Eagle3FirstLayer(config, self.max_position)] + [
            llama_draft_layer(config, self.max_position) for _ in range(config.num_hidden_layers - 1)])
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.draft_vocab_size = int(getattr(config, "draft_vocab_size", None) or config.vocab_size)
        self.lm_head = ParallelLMHead(self.draft_vocab_size, h)
        self.d2t = None
        if "d2t" in self.names or (not self.names and self.draft_vocab_size != target_config.vocab_size):
            # target id of each draft id, as an offset (zeros with load_format="dummy")
            self.d2t = nn.Parameter(torch.zeros(self.draft_vocab_size, dtype=torch.long), requires_grad=False)
        elif self.draft_vocab_size != target_config.vocab_size:
            raise ValueError(f"eagle3 draft: draft_vocab_size={self.draft_vocab_size} differs from the target's "
                             f"vocab_size={target_config.vocab_size} but the checkpoint has no d2t table mapping "
                             "draft ids to target ids")

    def aux_hidden_state_layers(self, target_config: Any) -> tuple[int, ...] | None:
        eagle = getattr(self.config, "eagle_config", None) or {}
        if not eagle.get("use_aux_hidden_state", True):
            return None
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        if ids:
            return tuple(int(i) for i in ids)
        return eagle3_default_layers(int(target_config.num_hidden_layers))

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc(hidden_states) if self.use_aux else hidden_states

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                spec_step_idx: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.layers[0](positions, self.embed_tokens(input_ids), hidden_states)
        for layer in self.layers[1:]:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def draft_token_ids(self, logits: torch.Tensor) -> torch.Tensor:
        ids = logits.argmax(dim=-1)
        return ids if self.d2t is None else ids + self.d2t[ids]

