"""Field sensitivity (CR-EQ-12) and the long-position example (CR-EQ-13), derived from any
example without a list of fields per family.

Every field of the reference config's ``to_dict()`` (so also the defaults an example leaves
out) gets perturbed legal values from its type and value alone: a bool flipped, a number
moved (counts by one and by a factor of two, an eps to 1e-2, other floats scaled), a window
made shorter than the probe prompt, a string swapped for another value that the reference's
own source compares that field against, a list of layer kinds rotated, a list of layer
indices shifted, a nested dict (``rope_parameters``) field by field plus its ``rope_type``
swapped for another with the parameters it needs. ``None`` fields get a value of the type
the config class annotates. Whether the reference reads a value is decided by building it
(``checks_perturbed``); fields that turn out dormant are retried together with the other
dormant fields that share a word of their name (``use_sliding_window`` + ``sliding_window``
+ ``max_window_layers``), since a feature is often switched on by several fields at once.
"""
from __future__ import annotations

import inspect
import math
import re
import sys
import typing
from dataclasses import dataclass
from typing import Any

from core_runner.conformance.harness import Example, reference_class, reference_config
from core_runner.registry import Registration

# never change an inference forward of the reference (training, output plumbing, token and
# label names, the weights' initialiser, which the checkpoint carries anyway) or are handled
# by their own check (quantization_config: conformance/quantized.py)
META_FIELDS = frozenset({
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "use_cache", "return_dict",
    "output_hidden_states", "output_attentions", "output_router_logits", "id2label", "label2id", "problem_type",
    "chunk_size_feed_forward", "is_encoder_decoder", "initializer_range", "_name_or_path", "quantization_config",
    "tie_encoder_decoder", "tokenizer_class", "torchscript", "pruned_heads", "task_specific_params",
    "finetuning_task", "prefix", "use_return_dict", "base_model_tp_plan", "base_model_pp_plan", "auto_map",
    "gradient_checkpointing",
})
META_WORDS = ("dropout", "initializer", "aux_loss", "z_loss", "token_id", "init_std", "_init_")
WINDOW = 8  # a perturbed window: shorter than the probe prompt
PROBE_LEN = 40  # the prompt every variant is probed with (longer than WINDOW, several blocks)
LONG_POSITIONS = 4096  # CR-EQ-13 for unscaled RoPE: positions reach this far (past a table cut at 2,048)
SCALED_POSITIONS = 8192  # CR-EQ-13 for scaled RoPE: at least this far, and past the original maximum
# another RoPE kind with the parameters each needs (transformers' ROPE_INIT_FUNCTIONS names)
ROPE_KINDS = {
    "linear": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 64},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}
# words that do not tie two fields to one feature
_STOP = frozenset({"use", "num", "n", "max", "min", "size", "of", "per", "layer", "layers", "dim", "type", "types",
                   "factor", "hidden", "is", "to", "and", "the", "head", "heads", "config", "rope", "theta"})
MAX_TRIES = 3  # candidates built per field (or group) before it is called dormant


@dataclass(frozen=True)
class Variant:
    updates: tuple[tuple[str, Any], ...]  # (dotted field, value) pairs moved together
    example: Example | None  # the perturbed example; None when the field cannot be moved
    reason: str | None = None  # why not, when example is None

    @property
    def field(self) -> str:
        return "+".join(f for f, _ in self.updates)

    @property
    def value(self) -> Any:
        return self.updates[0][1] if len(self.updates) == 1 else dict(self.updates)

    @property
    def label(self) -> str:
        return ", ".join(f"{f}={v!r}" for f, v in self.updates)

    @property
    def names(self) -> list[str]:
        """The last part of each dotted field: what a refusal must name."""
        return [f.rsplit(".", 1)[-1] for f, _ in self.updates]


@dataclass(frozen=True)
class FieldCandidates:
    """One field (or a group of dormant fields) and the values to try, best first."""
    field: str
    tries: tuple[tuple[tuple[str, Any], ...], ...]  # each try: the (field, value) pairs to set


# ---------------------------------------------------------------------------------
# what the reference accepts for a field
# ---------------------------------------------------------------------------------
def _config_class(reg: Registration) -> Any:
    return reference_class(reg).config_class


def _hints(reg: Registration) -> dict[str, Any]:
    """Field -> annotation, from the config class and its bases (what resolves: some name
    types that are imported only for type checking, and older classes annotate nothing)."""
    out: dict[str, Any] = {}
    for klass in reversed(_config_class(reg).__mro__):
        module = sys.modules.get(klass.__module__)
        scope = {**vars(typing), **(vars(module) if module else {})}
        for name, hint in inspect.get_annotations(klass).items():
            if isinstance(hint, str):
                try:
                    hint = eval(hint, scope)  # noqa: S307 - the library's own annotation text
                except Exception:  # noqa: BLE001 - an annotation that does not resolve gives no type
                    continue
            out[name] = hint
    return out


def _hint_types(hint: Any) -> set[type]:
    args = typing.get_args(hint)
    if not args:
        return {hint} if isinstance(hint, type) else set()
    return {a for a in args if isinstance(a, type) and a is not type(None)} | (
        {str} if typing.get_origin(hint) is typing.Literal else set())


_CMP = re.compile(r"(?:config|self)\.(\w+)(?:\[[^\]]*\])?\s*(?:==|!=)\s*[\"']([\w.\-]+)[\"']")
_CMP_REV = re.compile(r"[\"']([\w.\-]+)[\"']\s*(?:==|!=)\s*(?:config|self)\.(\w+)")
_IN = re.compile(r"(?:config|self)\.(\w+)(?:\[[^\]]*\])?\s+(?:not\s+)?in\s*[\(\[\{]([^\)\]\}]*)[\)\]\}]")
_LIT = re.compile(r"[\"']([\w.\-]+)[\"']")


def string_alternatives(reg: Registration) -> dict[str, set[str]]:
    """Field name -> the strings the reference's modeling and configuration source compare
    it against (``config.scoring_func == "sigmoid"``, ``self.layer_type in ("mamba", ...)``),
    with Literal annotations of the config class: the values transformers accepts."""
    out: dict[str, set[str]] = {}
    modules = {reference_class(reg).__module__, _config_class(reg).__module__}
    for name in modules:
        try:
            src = inspect.getsource(sys.modules[name])
        except (OSError, TypeError, KeyError):
            continue
        for attr, lit in _CMP.findall(src):
            out.setdefault(attr, set()).add(lit)
        for lit, attr in _CMP_REV.findall(src):
            out.setdefault(attr, set()).add(lit)
        for attr, body in _IN.findall(src):
            out.setdefault(attr, set()).update(_LIT.findall(body))
    for f, hint in _hints(reg).items():
        for arg in [hint, *typing.get_args(hint)]:
            if typing.get_origin(arg) is typing.Literal:
                out.setdefault(f, set()).update(a for a in typing.get_args(arg) if isinstance(a, str))
    return out


def _alternatives_for(name: str, alts: dict[str, set[str]]) -> set[str]:
    """Strings for ``name`` or, for a list of kinds, for its singular (layer_types -> layer_type)."""
    found = set(alts.get(name, ()))
    stem = name[:-1] if name.endswith("s") else name
    for attr, vals in alts.items():
        if attr != name and (attr == stem or attr.startswith(stem + "_")):
            found |= vals
    return found


def _activation_names() -> list[str]:
    try:
        from transformers.activations import ACT2FN

        return [a for a in ("gelu_pytorch_tanh", "silu", "gelu", "relu") if a in ACT2FN]
    except ImportError:  # pragma: no cover - transformers is a dependency of the suite
        return []


# ---------------------------------------------------------------------------------
# candidate values
# ---------------------------------------------------------------------------------
def _is_window(name: str) -> bool:
    return name.endswith("window") or name.endswith("window_size")


def _int_candidates(name: str, v: int, num_layers: int | None = None) -> list[int]:
    if _is_window(name):
        return [w for w in (WINDOW, WINDOW // 2) if w != v]
    if v == 0:
        return [1, 2]
    out = []
    if "layer" in name and num_layers and v > num_layers:  # a layer index or count past the last layer
        out += [c for c in (num_layers // 2, 0) if c != v]
    # far moves first (a hard-coded value must not pass by being close), then near ones
    # for a count that a far move makes invalid (heads that must divide)
    for c in (2 * v, v // 2, v + 1, v - 1):
        if c >= 0 and c != v and c not in out:
            out.append(c)
    return out


def _float_candidates(v: float) -> list[float]:
    if math.isnan(v):
        return []
    if math.isinf(v):
        return [1.0, 8.0]
    if v == 0.0:
        return [0.5, 0.1]
    if 0 < abs(v) < 1e-3:  # an eps: a change a float32 forward can see
        return [1e-2, 1e-1]
    return [round(v * 1.5 + 0.25, 6), round(v * 0.5, 6)]


def _list_candidates(name: str, v: list, alts: dict[str, set[str]], num_layers: int | None) -> list[list]:
    if not v:
        return [[0], [1]] if num_layers else []
    if all(isinstance(x, str) for x in v):
        if len(set(v)) >= 2:
            return [c for c in (v[1:] + v[:1], v[::-1]) if c != v][:2]
        other = sorted(_alternatives_for(name, alts) - set(v))
        return [[o] + v[1:] for o in other][:2] + [v[:-1] + [o] for o in other][:1]
    if all(isinstance(x, bool) for x in v):
        return [[not x for x in v]]
    if all(isinstance(x, int) for x in v):
        shifted = [(x + 1) % num_layers if num_layers else x + 1 for x in v]
        return [c for c in (shifted, v[:-1], [x + 1 for x in v]) if c != v][:2]
    if all(isinstance(x, (int, float)) for x in v):
        return [[1.0 if math.isinf(x) else round(x * 1.5 + 0.1, 6) for x in v]]
    return []


def _none_candidates(name: str, types: set[type], alts: dict[str, set[str]]) -> list[Any]:
    out: list[Any] = []
    if int in types:
        out += [WINDOW] if _is_window(name) else [16, 8]
    if float in types:
        out += [0.5, 5.0]
    if bool in types:
        out.append(True)
    if str in types:
        out += sorted(_alternatives_for(name, alts))[:2]
    return out


def _candidates(name: str, value: Any, types: set[type], alts: dict[str, set[str]],
                num_layers: int | None) -> list[Any]:
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int) and "theta" in leaf:  # a RoPE base written as an int
        return _float_candidates(float(value))
    if isinstance(value, int):
        return _int_candidates(leaf, value, num_layers)
    if isinstance(value, float):
        return _float_candidates(value)
    if isinstance(value, str):
        if leaf.endswith("act") and value in _activation_names():
            return [a for a in _activation_names() if a != value][:2]
        return sorted(_alternatives_for(leaf, alts) - {value})[:3]
    if isinstance(value, (list, tuple)):
        return [type(value)(c) if isinstance(value, tuple) else c
                for c in _list_candidates(leaf, list(value), alts, num_layers)]
    if value is None:
        return _none_candidates(leaf, types, alts)
    return []


def _rope_kind_tries(field: str, params: dict) -> list[tuple[tuple[str, Any], ...]]:
    """The whole rope dict replaced by another kind with the parameters it needs (kept: rope_theta)."""
    cur = params.get("rope_type") or params.get("type") or "default"
    tries = []
    for kind, extra in ROPE_KINDS.items():
        if kind != cur:
            new = {"rope_type": kind, **extra}
            if "rope_theta" in params:
                new["rope_theta"] = params["rope_theta"]
            tries.append(((field, new),))
    return tries


def _dict_candidates(prefix: str, value: dict, alts: dict[str, set[str]],
                     num_layers: int | None) -> list[FieldCandidates]:
    """Each entry of a nested dict (``rope_parameters``) moved alone, and a RoPE dict's kind swapped."""
    out = []
    for sub in sorted(value):
        if sub in ("rope_type", "type"):
            continue
        tries = [((f"{prefix}.{sub}", c),) for c in _candidates(f"{prefix}.{sub}", value[sub], set(), alts, num_layers)]
        if tries:
            out.append(FieldCandidates(f"{prefix}.{sub}", tuple(tries)))
    if "rope_theta" in value or "rope_type" in value:
        out.append(FieldCandidates(f"{prefix}.rope_type", tuple(_rope_kind_tries(prefix, value))))
    return out


def field_candidates(reg: Registration, example: Example) -> list[FieldCandidates]:
    """The fields of the reference config, each with the values to try."""
    base = reference_config(reg, example).to_dict()
    hints = _hints(reg)
    alts = string_alternatives(reg)
    num_layers = base.get("num_hidden_layers") if isinstance(base.get("num_hidden_layers"), int) else None
    out: list[FieldCandidates] = []
    for name in sorted(base):
        value = base[name]
        if name in META_FIELDS or any(w in name for w in META_WORDS) or name.startswith("_"):
            continue
        if isinstance(value, dict):
            # a dict of dicts is keyed by layer kind (Gemma3's rope_parameters per layer type): each entry
            # is moved as a dict of its own
            inner = [(f"{name}.{k}", v) for k, v in sorted(value.items()) if isinstance(v, dict)] or [(name, value)]
            for prefix, params in inner:
                out += _dict_candidates(prefix, params, alts, num_layers)
            continue
        tries = [((name, c),) for c in _candidates(name, value, _hint_types(hints.get(name)), alts, num_layers)]
        if tries:
            out.append(FieldCandidates(name, tuple(tries)))
    return out


def _words(field: str) -> set[str]:
    leaf = field.rsplit(".", 1)[-1]
    return {w for w in leaf.split("_") if w and w not in _STOP and not w.isdigit()}


def dormant_groups(dormant: list[FieldCandidates]) -> list[FieldCandidates]:
    """Dormant fields joined when they share a word of their name (transitively), each
    group moved at once to every member's first value: a feature switched on by several
    fields (a flag, a size, a layer count) is reached only together."""
    groups: list[list[FieldCandidates]] = []
    for fc in dormant:
        words = _words(fc.field)
        joined = [g for g in groups if any(words & _words(o.field) for o in g)]
        merged = [fc] + [o for g in joined for o in g]
        groups = [g for g in groups if g not in joined] + [merged]
    out = []
    for g in groups:
        if len(g) < 2:
            continue
        g = sorted(g, key=lambda fc: fc.field)
        # each member's tries in turn, the others at their first value: a layer count may need its second
        tries = []
        for i in range(max(len(fc.tries) for fc in g)):
            pairs = tuple(p for fc in g for p in fc.tries[min(i, len(fc.tries) - 1)])
            if pairs not in tries:
                tries.append(pairs)
        out.append(FieldCandidates("+".join(fc.field for fc in g), tuple(tries[:MAX_TRIES])))
    return out


# ---------------------------------------------------------------------------------
# building a perturbed example
# ---------------------------------------------------------------------------------
def _set(cfg: dict, base: dict, dotted: str, value: Any) -> None:
    """cfg[a][b]...[z] = value for ``a.b...z``, copying each dict on the way (from cfg, else
    from the reference's base config) so neither the example nor the base is written."""
    if "." not in dotted:
        cfg[dotted] = value
        return
    head, *path, leaf = dotted.split(".")
    top = dict(cfg.get(head) or base.get(head) or {})
    node = top
    for key in path:
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[leaf] = value
    cfg[head] = top


def moved(reg: Registration, example: Example, updates: tuple[tuple[str, Any], ...]) -> Example:
    """The example with ``updates`` applied. A new layer count resizes the per-layer lists
    the example gives (cyclically), so they stay valid."""
    base = reference_config(reg, example).to_dict()
    cfg = dict(example.config)
    for f, v in updates:
        if f == "rope_parameters" or f.startswith("rope_parameters."):
            cfg.pop("rope_theta", None)  # the legacy key would override rope_parameters
            cfg.pop("rope_scaling", None)
        _set(cfg, base, f, v)
        old = base.get(f)
        if f == "num_hidden_layers" and isinstance(old, int) and isinstance(v, int) and v > 0:
            for k, lst in list(cfg.items()):
                if k != f and isinstance(lst, list) and len(lst) == old and all(isinstance(x, str) for x in lst):
                    cfg[k] = [lst[i % old] for i in range(v)]
    label = ",".join(f"{f}={v}" for f, v in updates)
    return Example(f"{example.name}~{label}", cfg)


def variant(reg: Registration, example: Example, updates: tuple[tuple[str, Any], ...]) -> Variant:
    return Variant(updates, moved(reg, example, updates))


# ---------------------------------------------------------------------------------
# CR-EQ-13
# ---------------------------------------------------------------------------------
def _rope_params(base: dict) -> dict:
    params = base.get("rope_parameters") or base.get("rope_scaling") or {}
    return params if isinstance(params, dict) else {}


def long_length(base: dict) -> tuple[int, str]:
    """How far CR-EQ-13 reaches, and why: past the original maximum of a scaled RoPE (at least
    SCALED_POSITIONS), else LONG_POSITIONS; never past max_position_embeddings (raised to it
    where the example is smaller)."""
    params = _rope_params(base)
    kind = params.get("rope_type") or params.get("type") or "default"
    orig = params.get("original_max_position_embeddings") or base.get("original_max_position_embeddings")
    if kind not in ("default", None) and isinstance(orig, int):
        return max(SCALED_POSITIONS, orig + 256), f"{kind} RoPE with original_max_position_embeddings={orig}"
    if kind not in ("default", None):
        return SCALED_POSITIONS, f"{kind} RoPE"
    return LONG_POSITIONS, "unscaled RoPE"


def long_position_example(reg: Registration, example: Example) -> tuple[Example | None, int, str]:
    """(the example with max_position_embeddings raised to the length where it is smaller,
    the length, why that length) or (None, 0, why there is none)."""
    base = reference_config(reg, example).to_dict()
    mpe = base.get("max_position_embeddings")
    if mpe is None and not _rope_params(base) and "rope_theta" not in base:
        # no position limit and no RoPE (a recurrent model: Mamba2): the state still has to
        # carry a long prompt across chunks
        return Example(f"{example.name}~long", dict(example.config)), LONG_POSITIONS, "no position limit"
    if not isinstance(mpe, int):
        return None, 0, "the reference config has no max_position_embeddings"
    length, why = long_length(base)
    if mpe >= length:
        return Example(f"{example.name}~long", dict(example.config)), length, why
    cfg = dict(example.config, max_position_embeddings=length)
    return Example(f"{example.name}~long", cfg), length, why
