"""Numeric fields of a model config that no model can run with, refused when config.json is
read, before anything is allocated (a NaN eps or a zero RoPE base would otherwise load and
make every request finish with "error"). The rules go by field names that every family
shares (transformers' names), never by family; docs/config_validation.md lists them and
how they were checked against every config class transformers ships:

- no NaN anywhere in ``to_dict()`` (nested dicts and lists included), no infinity in a
  single-number field (a list may hold one: bounds such as ``[0.0, inf]``);
- eps fields (``*_eps``, ``*_epsilon``) are > 0;
- RoPE bases (``*rope_theta*``, ``*base_freq``; a single number) are > 0; inside a RoPE dict
  (a key holding ``rope``: ``rope_parameters``, ``rope_scaling``) every ``factor`` /
  ``*_factor`` (and each entry of a factor list) is > 0;
- the core sizes (``CORE_SIZES``; one value or one per layer) are integers (not bools or
  floats) in [1, 2**31 - 1];
  other sizes and counts (``*_size``, ``*_dim``, ``num_*``, ``*max_position_embeddings``)
  that are integers lie in [-1, 2**31 - 1] (-1 is a common "unset"); layer counts
  (``num_*layers``) are at most ``MAX_LAYERS``;
- ``num_key_value_heads`` divides ``num_attention_heads``.
"""
from __future__ import annotations

import math
from typing import Any, Iterator

# sizes every model needs at least one of
CORE_SIZES = frozenset({"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                        "vocab_size", "max_position_embeddings", "intermediate_size"})
INT32_MAX = 2**31 - 1  # the kernels index in int32
# layer counts (``num_*layers``) above this are refused: published LLMs have under 200 layers (DeepNet
# trained 1,000), and transformers itself needs minutes to read a config of 10**7 layers
MAX_LAYERS = 10_000


class ConfigValueError(ValueError):
    """A config.json value that no model can run with; the message names the file, the field
    and what would be valid."""


def _is_eps(leaf: str) -> bool:
    return leaf.endswith(("_eps", "_epsilon"))


def _is_rope_base(leaf: str) -> bool:
    return "rope_theta" in leaf or leaf.endswith("base_freq")


def _is_size(leaf: str) -> bool:
    return leaf.endswith(("_size", "_dim", "max_position_embeddings")) or leaf.startswith("num_")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fields(d: dict, prefix: str = "", in_rope: bool = False) -> Iterator[tuple[str, str, Any, bool]]:
    """(dotted name, leaf name, value, inside a RoPE dict) of every non-dict value, depth first."""
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _fields(value, name + ".", in_rope or "rope" in str(key))
        else:
            yield name, str(key), value, in_rope


def _problem(leaf: str, value: Any, in_rope: bool) -> str | None:
    """What is wrong with one value, or None."""
    is_list = isinstance(value, (list, tuple))
    items = list(value) if is_list else [value]
    if any(isinstance(x, float) and math.isnan(x) for x in items):
        return "expected a number, not NaN"
    if not is_list and isinstance(value, float) and math.isinf(value):
        return "expected a finite number"
    if value is None:
        return None
    if _is_eps(leaf) and not is_list and (not _is_number(value) or not value > 0):
        return "expected a number > 0 (a normalisation epsilon)"
    if _is_rope_base(leaf) and not is_list and (not _is_number(value) or not value > 0):
        return "expected a number > 0 (the RoPE base)"
    if in_rope and (leaf == "factor" or leaf.endswith("_factor")):
        if not all(_is_number(x) and math.isfinite(x) and x > 0 for x in items):
            return "expected a finite number > 0 (or a list of them): a RoPE scaling factor"
    if leaf.startswith("num_") and leaf.endswith("layers") and isinstance(value, int) and value > MAX_LAYERS:
        return f"expected at most {MAX_LAYERS:,} layers (a corrupt config?)"
    if leaf in CORE_SIZES:  # one value, or one per layer
        for x in items:
            if isinstance(x, bool) or not isinstance(x, int):
                return f"expected an integer >= 1 (a size), not a {type(x).__name__}"
            if not 1 <= x <= INT32_MAX:
                return "expected an integer in [1, 2**31 - 1]"
    elif _is_size(leaf):
        ints = [x for x in items if isinstance(x, int) and not isinstance(x, bool)]
        if any(not -1 <= x <= INT32_MAX for x in ints):
            return "expected a size or count in [0, 2**31 - 1] (or -1 for unset)"
    return None


def check_config_values(hf_config: Any, where: str) -> None:
    """Refuse a config (a transformers config or a dict) whose values no model can run with
    (the rules of this module's docstring), naming ``where`` (the file), the field, its value
    and what would be valid."""
    raw = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
    for name, leaf, value, in_rope in _fields(raw):
        why = _problem(leaf, value, in_rope)
        if why is not None:
            raise ConfigValueError(f"{where}: {name}={value!r} is invalid: {why}")
    stack: list[tuple[dict, str]] = [(raw, "")]
    while stack:
        d, prefix = stack.pop()
        heads, kv = d.get("num_attention_heads"), d.get("num_key_value_heads")
        if isinstance(heads, int) and isinstance(kv, int) and heads >= 1 and kv >= 1 and heads % kv:
            raise ConfigValueError(
                f"{where}: {prefix}num_key_value_heads={kv} does not divide {prefix}num_attention_heads={heads}: "
                "each key/value head serves a whole group of query heads; expected a divisor")
        stack += [(v, f"{prefix}{k}.") for k, v in d.items() if isinstance(v, dict)]
