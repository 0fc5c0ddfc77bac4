"""RoPE settings read from a Hugging Face config, and the cos/sin table they give.

The inverse frequencies and the attention factor come from transformers' own
initialisation functions (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``), so every rope
type transformers knows is computed exactly as its models compute it. Only 'default',
which transformers keeps per model class, is the plain ``theta ** (-2i / dim)`` here.

The table is ``[max_position, rotary_dim]`` float32, cos in the first half, sin in the
second, both multiplied by the attention factor as transformers does. Row p holds what a
token at position p is rotated with; a token's rotation never changes once its key is in
the KV cache. Two types depend on the sequence length in transformers, where a forward
over a whole sequence ropes every position with the frequencies of that length:

- ``dynamic`` (NTK): row p uses the frequencies transformers computes for a sequence of
  length max(p + 1, max_position_embeddings). Up to max_position_embeddings that is the
  unscaled table, identical to transformers for every such sequence. Beyond it, row p is
  what transformers gives the token at p when it decodes one token at a time with a cache
  (it rescales only for the new token); a single forward over more than
  max_position_embeddings tokens in transformers ropes the earlier tokens with the longer
  length's frequencies instead, which a KV cache cannot reproduce.
- ``longrope``: rows below original_max_position_embeddings use ``short_factor``, rows at
  or beyond it ``long_factor``. Identical to transformers for sequences up to the original
  length and to its cached token-by-token decoding past it; a single transformers forward
  over a longer sequence ropes all positions with ``long_factor``.

Either way the result for a token does not depend on which other requests share its batch.
"""
from __future__ import annotations

import math
from typing import Any

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
_NEEDS_ORIGINAL_MAX = ("llama3", "yarn", "longrope")


def rope_parameters_of(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The config's RoPE settings as one flat dict with at least ``rope_type``, ``rope_theta``
    and ``partial_rotary_factor``: from ``rope_parameters`` (transformers 5), the legacy
    ``rope_scaling`` dict (``type`` or ``rope_type``), ``rope_theta`` and
    ``partial_rotary_factor`` attributes, in that order of precedence. ``layer_type`` picks
    one entry of a per-layer-type (nested) ``rope_parameters``."""
    params = getattr(config, "rope_parameters", None)
    legacy = getattr(config, "rope_scaling", None)
    out: dict[str, Any] = dict(legacy) if isinstance(legacy, dict) else {}
    if isinstance(params, dict):
        nested = [k for k, v in params.items() if isinstance(v, dict)]
        if layer_type is not None:
            if layer_type not in nested:
                raise ValueError(f"layer_type={layer_type!r} has no entry in rope_parameters: it has {nested}")
            params = params[layer_type]
        elif nested:
            raise ValueError(f"rope_parameters is nested by layer type {nested}: pass layer_type= one of them")
        out.update(params)
    if layer_type is not None and not isinstance(getattr(config, "rope_parameters", None), dict):
        raise ValueError(f"layer_type={layer_type!r} given but the config has no per-layer rope_parameters")
    kind = out.get("rope_type") or out.get("type") or "default"
    out.pop("type", None)
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type={kind!r} is not supported: expected one of {ROPE_TYPES}")
    out["rope_type"] = kind
    if out.get("rope_theta") is None:
        out["rope_theta"] = float(getattr(config, "rope_theta", None) or 10000.0)
    if out.get("partial_rotary_factor") is None:
        out["partial_rotary_factor"] = float(getattr(config, "partial_rotary_factor", None) or 1.0)
    if kind in _NEEDS_ORIGINAL_MAX:
        # as transformers: a top-level original_max_position_embeddings (Phi-3) wins
        top = getattr(config, "original_max_position_embeddings", None)
        if top is not None:
            out["original_max_position_embeddings"] = top
        elif out.get("original_max_position_embeddings") is None:
            out["original_max_position_embeddings"] = _max_position_embeddings(config)
    return out


def _max_position_embeddings(config: Any) -> int:
    value = getattr(config, "max_position_embeddings", None)
    if not value:
        raise ValueError("the config has no max_position_embeddings: the RoPE table length is unknown "
                         "(pass max_position=)")
    return int(value)


def default_inv_freq(theta: float, rotary_dim: int) -> torch.Tensor:
    """Plain RoPE's float32 inverse frequencies ``theta ** (-2i / rotary_dim)``, on CPU."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    return 1.0 / (float(theta) ** exponents)


def cos_sin_of(inv_freq: torch.Tensor, max_position: int, attention_factor: float = 1.0) -> torch.Tensor:
    """``[max_position, rotary_dim]``: cos | sin of position x inv_freq (one set, or one per
    position), times the attention factor, float32 on CPU."""
    positions = torch.arange(max_position, dtype=torch.float32, device="cpu")
    freqs = positions[:, None] * (inv_freq if inv_freq.dim() == 1 else inv_freq[:max_position])
    return torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1).contiguous()


class _InitConfig:
    """What transformers' rope init functions read from a config, with the rotary width
    as ``head_dim`` (partial rotary already applied) so one code path serves q/k heads,
    partial rotary and DeepSeek's rope-only half alike."""

    def __init__(self, params: dict[str, Any], rotary_dim: int, max_position_embeddings: int) -> None:
        self.rope_parameters = {**params, "partial_rotary_factor": 1.0}
        self.head_dim = rotary_dim
        self.hidden_size, self.num_attention_heads = rotary_dim, 1
        self.max_position_embeddings = max_position_embeddings

    def standardize_rope_params(self) -> None:
        """Already standard (``rope_parameters_of``)."""


def _inv_freq_and_factor(
    params: dict[str, Any], rotary_dim: int, max_position_embeddings: int, max_position: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies, [rotary_dim / 2] or per position [max_position, rotary_dim / 2]."""
    cpu = torch.device("cpu")
    kind = params["rope_type"]
    if kind == "default":
        return default_inv_freq(params["rope_theta"], rotary_dim), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS[kind]
    shim = _InitConfig(params, rotary_dim, max_position_embeddings)
    inv_freq, factor = init(shim, cpu)
    if kind == "dynamic" and max_position > max_position_embeddings:
        lengths = torch.arange(max_position_embeddings + 1, max_position + 1, dtype=torch.int64, device=cpu)
        longer, _ = init(shim, cpu, seq_len=lengths[:, None])
        inv_freq = torch.cat([inv_freq.expand(max_position_embeddings, -1), longer])
    elif kind == "longrope":
        original = int(params["original_max_position_embeddings"])
        long_inv_freq, _ = init(shim, cpu, seq_len=original + 1)
        rows = torch.arange(max_position, device=cpu)[:, None]
        inv_freq = torch.where(rows >= original, long_inv_freq, inv_freq)
    return inv_freq.float(), float(factor)


def rope_cos_sin_table(
    config: Any, rotary_dim: int, max_position: int | None = None, layer_type: str | None = None
) -> torch.Tensor:
    """The ``[max_position, rotary_dim]`` float32 cos|sin table (module docstring), on CPU.
    ``max_position`` defaults to the config's max_position_embeddings."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim={rotary_dim} must be a positive even number")
    params = rope_parameters_of(config, layer_type)
    max_pos_emb = _max_position_embeddings(config)
    max_position = max_pos_emb if max_position is None else int(max_position)
    if max_position <= 0:
        raise ValueError(f"max_position={max_position} must be positive")
    inv_freq, factor = _inv_freq_and_factor(params, rotary_dim, max_pos_emb, max_position)
    if inv_freq.shape[-1] != rotary_dim // 2:
        raise ValueError(f"rope_type={params['rope_type']!r} gave {inv_freq.shape[-1]} frequencies for "
                         f"rotary_dim={rotary_dim} (expected {rotary_dim // 2}): check its factor lists")
    return cos_sin_of(inv_freq, max_position, factor)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched ``scale`` times."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_softmax_scale(config: Any, head_dim: int) -> float:
    """``head_dim ** -0.5``, times ``yarn_get_mscale(factor, mscale_all_dim) ** 2`` when the
    rope is scaled and has ``mscale_all_dim`` (DeepSeek-V2/V3 do so: the cos/sin attention
    factor then cancels to 1 and the softmax scale carries the correction)."""
    scale = float(head_dim) ** -0.5
    params = rope_parameters_of(config)
    all_dim = params.get("mscale_all_dim")
    if params["rope_type"] != "default" and all_dim:
        factor = params.get("factor")
        if factor is None:
            raise ValueError(f"rope_type={params['rope_type']!r} with mscale_all_dim={all_dim} has no 'factor'")
        m = yarn_get_mscale(float(factor), float(all_dim))
        scale *= m * m
    return scale
