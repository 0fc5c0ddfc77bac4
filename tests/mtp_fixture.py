"""Tiny DeepSeek-V3 checkpoints with multi-token-prediction layers, and a reference MTP.

transformers has no MTP, so the target is written by transformers' DeepseekV3ForCausalLM
and each MTP layer N + i (N = num_hidden_layers) is taken from a second, one-layer
DeepseekV3ForCausalLM (``refs[i]``, its layer MoE when N + i >= first_k_dense_replace):
its layer 0 becomes ``model.layers.{N + i}.*``, its final norm ``shared_head.norm``, its
lm_head ``shared_head.head`` and its embedding ``embed_tokens``, written with random
``enorm`` / ``hnorm`` / ``eh_proj`` into ``mtp.safetensors`` beside the target's file
(the target's loader ignores ``model.layers.{N}.*``). ``refs[i]`` called on
inputs_embeds = eh_proj([enorm(e) | hnorm(h)]) then is the reference of layer i: its
logits are shared_head(y), its layer-0 output y.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from core_runner_deepseek.hooks import TINY_V3
from helpers import read_checkpoint
from safetensors.torch import save_file

CONFIG = {**TINY_V3, "eos_token_id": None, "bos_token_id": None, "pad_token_id": None}


@dataclass
class MtpCheckpoint:
    path: str
    target: Any  # transformers.DeepseekV3ForCausalLM, float32, eval
    refs: list  # one one-layer DeepseekV3ForCausalLM per MTP layer (see the module docstring)
    own: list  # per MTP layer: {"enorm", "hnorm", "eh_proj"} tensors
    config: dict = field(default_factory=dict)

    @property
    def num_hidden_layers(self) -> int:
        return self.config["num_hidden_layers"]


def _randomize_norms(model: torch.nn.Module, g: torch.Generator) -> None:
    # ones everywhere would hide a norm applied to the wrong tensor
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def build_mtp_checkpoint(path: Path, num_mtp: int = 1, seed: int = 0, share_embed_head: bool = True,
                         edit=None, **overrides: Any) -> MtpCheckpoint:
    """A target plus ``num_mtp`` MTP layers at ``path``. ``share_embed_head``: the MTP
    layers' embed_tokens / shared_head.head are copies of the target's (as DeepSeek-V3
    ships them), else their own. ``edit(target, refs, own)`` may change any weight
    before the files are written."""
    import transformers

    cfg = {**CONFIG, **overrides, "num_nextn_predict_layers": num_mtp}
    n = cfg["num_hidden_layers"]
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    target = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg)).to(torch.float32).eval()
    refs, own = [], []
    for i in range(num_mtp):
        dense = n + i < cfg["first_k_dense_replace"]
        ref_cfg = transformers.DeepseekV3Config(**{**cfg, "num_hidden_layers": 1, "first_k_dense_replace": int(dense)})
        ref = transformers.DeepseekV3ForCausalLM(ref_cfg).to(torch.float32).eval()
        with torch.no_grad():
            _randomize_norms(ref, g)
            if not dense:  # a random correction bias changes which experts are chosen
                bias = ref.model.layers[0].mlp.gate.e_score_correction_bias
                bias.copy_(0.3 * torch.randn(bias.shape, generator=g))
            if share_embed_head:
                ref.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
                ref.lm_head.weight.copy_(target.lm_head.weight)
        h = cfg["hidden_size"]
        own.append({"enorm": 1.0 + 0.1 * torch.randn(h, generator=g), "hnorm": 1.0 + 0.1 * torch.randn(h, generator=g),
                    "eh_proj": 0.05 * torch.randn(h, 2 * h, generator=g)})
        refs.append(ref)
    if edit is not None:
        with torch.no_grad():
            edit(target, refs, own)
    path = Path(path)
    target.save_pretrained(str(path))
    tensors = {}
    for i, (ref, mine) in enumerate(zip(refs, own)):
        ref_dir = path.parent / f"{path.name}-ref{i}"  # per-expert names as transformers writes them
        ref.save_pretrained(str(ref_dir))
        prefix = f"model.layers.{n + i}."
        for name, t in read_checkpoint(ref_dir).items():
            if name.startswith("model.layers.0."):
                tensors[prefix + name.removeprefix("model.layers.0.")] = t
        ref_sd = ref.state_dict()
        tensors[prefix + "embed_tokens.weight"] = ref_sd["model.embed_tokens.weight"]
        tensors[prefix + "shared_head.norm.weight"] = ref_sd["model.norm.weight"]
        tensors[prefix + "shared_head.head.weight"] = ref_sd["lm_head.weight"]
        tensors.update({f"{prefix}{k}.weight": v for k, v in mine.items()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "mtp.safetensors"))
    return MtpCheckpoint(str(path), target, refs, own, json.loads((path / "config.json").read_text()))


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@torch.no_grad()
def target_hidden(ckpt: MtpCheckpoint, seq: list[int]) -> torch.Tensor:
    """The target's final-normed hidden states [len(seq), hidden] (what its forward returns)."""
    return ckpt.target.model(input_ids=torch.tensor([seq])).last_hidden_state[0]


@torch.no_grad()
def mtp_reference(ckpt: MtpCheckpoint, layer: int, tokens: list[int], hidden: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """MTP layer ``layer`` over positions 0..T-1 of one sequence, from scratch: position p
    reads ``tokens[p]`` (the token at p + 1) and ``hidden[p]``. Returns (logits [T, vocab],
    the layer's output stream y [T, hidden])."""
    ref, mine, eps = ckpt.refs[layer], ckpt.own[layer], ckpt.config["rms_norm_eps"]
    # every layer embeds with the first layer's embedding (one is loaded, as vLLM does)
    e = ckpt.refs[0].model.embed_tokens(torch.tensor(tokens)).clone()
    e[0] = 0.0  # position 0 reads no token (vLLM's rule)
    x = torch.cat([_rms(e, mine["enorm"], eps), _rms(hidden, mine["hnorm"], eps)], -1) @ mine["eh_proj"].T
    seen = []
    hook = ref.model.layers[0].register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        logits = ref(inputs_embeds=x[None]).logits[0]
    finally:
        hook.remove()
    return logits, seen[0][0]
