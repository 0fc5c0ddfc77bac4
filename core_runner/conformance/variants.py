"""Perturbed examples (CR-EQ-12) and the long-position example (CR-EQ-13).

A registration's examples often leave a config field at the library default (rope base
10,000, eps 1e-6, head_dim = hidden / heads, no biases), so a model that hard-codes the
default passes every check that uses them. ``perturbations`` derives, from any example,
one variant per field the reference config reads, each moving that one field to a value
that is neither the example's nor the config class's default. Fields are found
generically, from the reference's ``config_class`` (its defaults and the example's
effective values), never per family.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core_runner.conformance.harness import Example, reference_class, reference_config
from core_runner.registry import Registration

EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon")
BIAS_FIELDS = ("attention_bias", "mlp_bias", "qkv_bias", "use_bias")
# float scales that several families read at inference (granite's multipliers, MoE routing scales)
SCALE_SUFFIXES = ("_multiplier", "_scaling", "scaling_factor")
LONG_POSITIONS = 4096  # CR-EQ-13: positions reach this far (past a table cut at 2,048)


@dataclass(frozen=True)
class Variant:
    field: str  # the config field moved, dotted for nested dicts ("rope_parameters.rope_theta")
    value: Any  # its value in the variant
    example: Example | None  # the perturbed example; None when the field cannot be moved
    reason: str | None = None  # why not, when example is None

    @property
    def label(self) -> str:
        return f"{self.field}={self.value!r}"


def _defaults(reg: Registration) -> dict:
    """The config class's defaults (empty when it cannot be built without arguments)."""
    try:
        return reference_class(reg).config_class().to_dict()
    except Exception:  # noqa: BLE001 - a class with required arguments has no usable defaults
        return {}


def _pick(candidates: list[Any], *avoid: Any) -> Any:
    return next(c for c in candidates if all(c != a for a in avoid))


def _moved(example: Example, field: str, value: Any, drop: tuple[str, ...] = ()) -> Example:
    cfg = {k: v for k, v in example.config.items() if k not in drop}
    cfg[field] = value
    return Example(f"{example.name}~{field}", cfg)


def _rope(ex: Example, base: dict, defaults: dict) -> Variant | None:
    params = base.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        cur, dflt = params["rope_theta"], (defaults.get("rope_parameters") or {}).get("rope_theta")
        new = _pick([1_000_000.0, 500_000.0, 250_000.0], cur, dflt)
        # the legacy rope_theta key, when the example has one, would override rope_parameters
        return Variant("rope_parameters.rope_theta", new,
                       _moved(ex, "rope_parameters", {**params, "rope_theta": new}, drop=("rope_theta",)))
    if base.get("rope_theta") is not None:
        new = _pick([1_000_000.0, 500_000.0], base["rope_theta"], defaults.get("rope_theta"))
        return Variant("rope_theta", new, _moved(ex, "rope_theta", new))
    return None


def _head_dim(ex: Example, base: dict, defaults: dict) -> Variant | None:
    if "head_dim" not in defaults or not base.get("head_dim"):
        return None
    heads, hidden = base.get("num_attention_heads"), base.get("hidden_size")
    if not heads or not hidden:
        return Variant("head_dim", None, None, "the config has no num_attention_heads / hidden_size")
    q = hidden // heads
    new = _pick([2 * q, q // 2 if q % 4 == 0 else 2 * q, 4 * q], base["head_dim"], q)
    return Variant("head_dim", new, _moved(ex, "head_dim", new))


def _kv_heads(ex: Example, base: dict) -> Variant | None:
    heads, kv = base.get("num_attention_heads"), base.get("num_key_value_heads")
    if not heads or kv is None:
        return None
    choices = [d for d in range(heads - 1, 0, -1) if heads % d == 0 and d != kv]
    if not choices:
        return Variant("num_key_value_heads", None, None, f"no divisor of num_attention_heads={heads} below it "
                                                          f"other than the example's {kv}")
    return Variant("num_key_value_heads", choices[0], _moved(ex, "num_key_value_heads", choices[0]))


def perturbations(reg: Registration, example: Example) -> list[Variant]:
    """One variant per config field that the reference config has; the check decides,
    by building the reference, whether the reference accepts it and reads it."""
    base = reference_config(reg, example).to_dict()
    defaults = _defaults(reg)
    out: list[Variant | None] = [_rope(example, base, defaults)]
    for f in EPS_FIELDS:
        if isinstance(base.get(f), float):
            out.append(Variant(f, v := _pick([1e-2, 2e-2], base[f]), _moved(example, f, v)))
    out.append(_head_dim(example, base, defaults))
    out.append(_kv_heads(example, base))
    if isinstance(base.get("tie_word_embeddings"), bool):
        flip = not base["tie_word_embeddings"]
        out.append(Variant("tie_word_embeddings", flip, _moved(example, "tie_word_embeddings", flip)))
    for f in BIAS_FIELDS:
        if isinstance(defaults.get(f), bool) and isinstance(base.get(f), bool):
            out.append(Variant(f, not base[f], _moved(example, f, not base[f])))
    if isinstance(base.get("hidden_act"), str):
        act = _pick(["gelu_pytorch_tanh", "silu"], base["hidden_act"])
        out.append(Variant("hidden_act", act, _moved(example, "hidden_act", act)))
    for f, v in sorted(base.items()):
        if f.endswith(SCALE_SUFFIXES) and isinstance(v, float) and not isinstance(v, bool):
            new = _pick([round(v * 1.5 + 0.25, 6), round(v * 2.0 + 0.5, 6)], v, defaults.get(f))
            out.append(Variant(f, new, _moved(example, f, new)))
    return [v for v in out if v is not None]


def long_position_example(reg: Registration, example: Example) -> tuple[Example | None, str | None]:
    """The example with max_position_embeddings raised to LONG_POSITIONS (kept when the
    example is larger: the request is capped there on a CPU), or why there is none."""
    base = reference_config(reg, example).to_dict()
    mpe = base.get("max_position_embeddings")
    if not isinstance(mpe, int):
        return None, "the reference config has no max_position_embeddings"
    if mpe >= LONG_POSITIONS:
        return Example(f"{example.name}~long", dict(example.config)), None
    return _moved(example, "max_position_embeddings", LONG_POSITIONS), None
