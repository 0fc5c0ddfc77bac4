"""Tiny EAGLE / EAGLE-3 draft checkpoints, plain-torch references of the drafts' formulas,
and a harness that runs a model's modules outside the engine.

The checkpoints are written as the published ones are laid out (config.json naming the
architecture, safetensors with the drafts' own tensor names: ``fc``, ``layers.0`` or
``midlayer``, ``d2t`` / ``t2d``), with random weights from a fixed seed. The references
read those files, not the modules, so that a loading mistake shows too.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from core_runner.attention.backend import AttnMetadata
from core_runner.attention.torch_backend import TorchPagedAttention
from core_runner.forward_context import set_forward_context
from core_runner.kv_cache_spec import collect_kv_cache_specs

# one Llama layer as wide as the tests' Qwen3 target (tests/helpers.py TINY); its own rope
# theta and a shorter max_position_embeddings than the target's, as the real drafts have
DRAFT_BASE = dict(
    model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=5000.0, max_position_embeddings=32,
    hidden_act="silu", tie_word_embeddings=False, torch_dtype="float32",
)
STD = 0.15  # wide, as tests/helpers.py explains, so that argmaxes are clear


def _randn(g: torch.Generator, *shape: int, std: float = STD) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * std


def _norm_weight(g: torch.Generator, h: int) -> torch.Tensor:
    # not ones: a norm applied to the wrong tensor, or left out, changes the outputs
    return 1.0 + _randn(g, h, std=0.2)


def layer_tensors(g: torch.Generator, cfg: dict, in_size: int, prefix: str, input_norm: bool) -> dict:
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {
        f"{prefix}self_attn.q_proj.weight": _randn(g, heads * d, in_size),
        f"{prefix}self_attn.k_proj.weight": _randn(g, kv * d, in_size),
        f"{prefix}self_attn.v_proj.weight": _randn(g, kv * d, in_size),
        f"{prefix}self_attn.o_proj.weight": _randn(g, h, heads * d),
        f"{prefix}mlp.gate_proj.weight": _randn(g, i, h),
        f"{prefix}mlp.up_proj.weight": _randn(g, i, h),
        f"{prefix}mlp.down_proj.weight": _randn(g, h, i),
        f"{prefix}post_attention_layernorm.weight": _norm_weight(g, h),
    }
    if input_norm:
        out[f"{prefix}input_layernorm.weight"] = _norm_weight(g, h)
    return out


def write_checkpoint(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return str(path)


def write_eagle(path: Path, vocab: int, seed: int, *, prefixed: bool = False, with_embed: bool = False,
                fc_bias: bool = False, stray_input_norm: bool = False, arch: str = "LlamaForCausalLM") -> str:
    """An EAGLE-1 draft: ``fc`` [H, 2H] and one Llama layer without input_layernorm.
    ``prefixed`` names every tensor ``model.*``; ``with_embed`` adds an embedding of its own
    (random, unlike the target's, so a test can tell which one is used); ``stray_input_norm``
    adds the layer-0 input norm that EAGLE leaves out (and the loader must ignore)."""
    cfg = {**DRAFT_BASE, "architectures": [arch], "vocab_size": vocab}
    g = torch.Generator().manual_seed(seed)
    h = cfg["hidden_size"]
    t = {"fc.weight": _randn(g, h, 2 * h), **layer_tensors(g, cfg, h, "layers.0.", input_norm=stray_input_norm)}
    if fc_bias:
        t["fc.bias"] = _randn(g, h)
    if with_embed:
        t["embed_tokens.weight"] = _randn(g, vocab, h, std=1.0)
    if prefixed:
        t = {f"model.{k}": v for k, v in t.items()}
    return write_checkpoint(path, cfg, t)


def write_eagle3(path: Path, vocab: int, draft_vocab: int, seed: int, *, layer_ids: list[int] | None,
                 midlayer: bool = True, with_embed: bool = False, arch: str = "LlamaForCausalLMEagle3",
                 norm_before_residual: bool = False) -> str:
    """An EAGLE-3 draft: ``fc`` [H, 3H], ``midlayer`` (or ``model.layers.0``) with
    ``hidden_norm`` and q/k/v over 2H, ``norm``, ``lm_head`` over ``draft_vocab`` ids, and
    ``d2t`` mapping them to a random sorted subset of the target's ids (``t2d`` beside it)."""
    cfg = {**DRAFT_BASE, "architectures": [arch], "vocab_size": vocab, "draft_vocab_size": draft_vocab}
    if norm_before_residual:
        cfg["norm_before_residual"] = True
    if layer_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True}
    g = torch.Generator().manual_seed(seed)
    h = cfg["hidden_size"]
    prefix = "midlayer." if midlayer else "model.layers.0."
    t = layer_tensors(g, cfg, 2 * h, prefix, input_norm=True)
    t[f"{prefix}hidden_norm.weight"] = _norm_weight(g, h)
    targets = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[targets] = True
    t.update({
        "fc.weight": _randn(g, h, 3 * h), "norm.weight": _norm_weight(g, h),
        "lm_head.weight": _randn(g, draft_vocab, h), "d2t": targets - torch.arange(draft_vocab), "t2d": t2d,
    })
    if with_embed:
        t["embed_tokens.weight"] = _randn(g, vocab, h, std=1.0)
    return write_checkpoint(path, cfg, t)


# ---------------------------------------------------------------------------------
# plain-torch references (float32)
# ---------------------------------------------------------------------------------
def weights(path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, tensors with ``model.`` stripped and ``midlayer.`` as ``layers.0.``)."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    out = {}
    for k, v in load_file(str(Path(path) / "model.safetensors")).items():
        k = k.removeprefix("model.")
        out["layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k] = v
    return cfg, out


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotation of [T, heads, D] by each token's position."""
    d = x.shape[-1]
    freqs = positions.float()[:, None] * (1.0 / theta ** (torch.arange(0, d, 2).float() / d))[None]
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(x: torch.Tensor, w: dict, p: str, cfg: dict, positions: torch.Tensor) -> torch.Tensor:
    """Causal GQA over one sequence (every token of ``x``), RoPE with the config's theta."""
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (x @ w[f"{p}q_proj.weight"].T).view(-1, heads, d)
    k = (x @ w[f"{p}k_proj.weight"].T).view(-1, kv, d)
    v = (x @ w[f"{p}v_proj.weight"].T).view(-1, kv, d)
    q, k = rope(q, positions, cfg["rope_theta"]), rope(k, positions, cfg["rope_theta"])
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
    n = x.shape[0]
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * d)
    return out @ w[f"{p}o_proj.weight"].T


def mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    return (F.silu(x @ w[f"{p}gate_proj.weight"].T) * (x @ w[f"{p}up_proj.weight"].T)) @ w[f"{p}down_proj.weight"].T


def eagle_ref(path: str, embed: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """EAGLE-1: x = fc([embed(ids); hidden]); attention without an input norm; out = x + r."""
    cfg, w = weights(path)
    embed = w.get("embed_tokens.weight", embed)
    x = torch.cat([embed[ids], hidden], -1) @ w["fc.weight"].T + w.get("fc.bias", 0.0)
    s = x + attention(x, w, "layers.0.self_attn.", cfg, positions)
    return s + mlp(rms(s, w["layers.0.post_attention_layernorm.weight"], cfg["rms_norm_eps"]), w, "layers.0.mlp.")


def eagle3_ref(path: str, embed: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3's layer: (normed, prenorm) for draft inputs ``hidden`` (fc already applied);
    the residual is ``hidden``, or its normed self with ``norm_before_residual``."""
    cfg, w = weights(path)
    embed, eps, p = w.get("embed_tokens.weight", embed), cfg["rms_norm_eps"], "layers.0."
    embeds = rms(embed[ids], w[f"{p}input_layernorm.weight"], eps)
    normed = rms(hidden, w[f"{p}hidden_norm.weight"], eps)
    x = torch.cat([embeds, normed], -1)
    s = (normed if cfg.get("norm_before_residual") else hidden) + attention(x, w, f"{p}self_attn.", cfg, positions)
    pre = s + mlp(rms(s, w[f"{p}post_attention_layernorm.weight"], eps), w, f"{p}mlp.")
    return rms(pre, w["norm.weight"], eps), pre


# ---------------------------------------------------------------------------------
# running modules outside the engine
# ---------------------------------------------------------------------------------
class OneSequence:
    """Runs modules with paged attention layers over one sequence on the torch backend:
    each module gets its own caches; slot = position (the block table is the identity)."""

    def __init__(self, *modules: torch.nn.Module, block_size: int = 4, num_blocks: int = 32) -> None:
        for m in modules:
            for spec in collect_kv_cache_specs(m, torch.float32):
                m.get_submodule(spec.layer_name).kv_cache = spec.allocate(num_blocks, block_size, "cpu")
        self.block_table = torch.arange(num_blocks, dtype=torch.int32)[None]
        self.backend = TorchPagedAttention()

    def tokens(self, start: int, n: int) -> Any:
        """The forward context of positions start .. start + n - 1 (those before are cached)."""
        qsl = torch.tensor([0, n], dtype=torch.int32)
        seq = torch.tensor([start + n], dtype=torch.int32)
        md = AttnMetadata(
            num_reqs=1, num_tokens=n, query_start_loc=qsl, seq_lens=seq, block_tables=self.block_table,
            slot_mapping=torch.arange(start, start + n), query_start_loc_cpu=qsl, seq_lens_cpu=seq,
            max_query_len=n, max_seq_len=start + n,
        )
        return set_forward_context(md, self.backend, "torch")
