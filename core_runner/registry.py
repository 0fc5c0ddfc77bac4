"""The architecture registry: which plugin provides which model, and what it can do.

Registrations hold lazy ``"module:attr"`` strings, so listing models imports no torch
model code. ``registry.toml`` lists the built-in architectures so that a missing
plugin produces an error naming the package to install.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core_runner.sdk_version import check_sdk_range

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CAPABILITIES = (
    "chunked_prefill", "cuda_graphs", "async_scheduling", "prefix_caching", "triton_attention",
    # loads checkpoints with quantization_config.quant_method "fp8" (core_runner.quantization)
    "quantization:fp8",
    "kv_cache_dtype:fp8",
    # loads compressed-tensors 'float-quantized' fp8 checkpoints (core_runner.quantization.compressed_tensors)
    "quantization:compressed-tensors",
    # runs with tensor_parallel_size > 1 (its layers split across ranks: core_runner.layers)
    "tensor_parallel",
    # its MoE layers can hold whole experts per rank (enable_expert_parallel=True)
    "expert_parallel",
    # steps that verify k proposed tokens per request (speculative_config); a family whose
    # per-row state cannot be rolled back to the accepted prefix must not declare it
    "speculative_decoding",
)
STATES = ("supported", "unsupported", "xfail", "not applicable")
# capabilities a family may declare "not applicable: <reason>": the feature has nothing to
# act on in it (the Triton attention backend in a model without attention layers), so the
# oracle neither uses nor downgrades anything for it and the suite checks the claim instead
# of the feature; any other capability that a family lacks is "unsupported" (refused)
MAY_NOT_APPLY = ("triton_attention", "kv_cache_dtype:fp8")


@dataclass(frozen=True)
class Capability:
    state: str
    reason: str = ""

    @classmethod
    def parse(cls, name: str, value: Any) -> "Capability":
        if isinstance(value, Capability):
            return value
        if isinstance(value, str) and value in ("supported", "unsupported"):
            return cls(value)
        if isinstance(value, str) and value.startswith("xfail"):
            reason = value[len("xfail"):].lstrip(": ").strip()
            if reason:
                return cls("xfail", reason)
        if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] == "xfail" and value[1]:
            return cls("xfail", str(value[1]))
        if isinstance(value, str) and value.startswith("not applicable"):
            reason = value[len("not applicable"):].lstrip(": ").strip()
            if name not in MAY_NOT_APPLY:
                raise ValueError(f"capability {name}={value!r}: only {', '.join(MAY_NOT_APPLY)} may be declared "
                                 f"'not applicable'; declare {name} 'unsupported' (asking for it is then refused)")
            if reason:
                return cls("not applicable", reason)
        raise ValueError(
            f"capability {name}={value!r} is invalid: expected 'supported', 'unsupported', "
            "'xfail: <reason>' or (triton_attention) 'not applicable: <reason>'"
        )

    @property
    def supported(self) -> bool:
        return self.state == "supported"

    @property
    def not_applicable(self) -> bool:
        return self.state == "not applicable"


@dataclass(frozen=True)
class Registration:
    architecture: str
    model: str
    model_state: str
    capabilities: dict[str, Capability]
    reference: str | None = None
    examples: tuple[dict, ...] = ()
    sdk_version: str | None = None  # the SDK range the plugin declared (core_runner.sdk_version)
    plugin: str = "<direct>"
    tasks: tuple[str, ...] = ("generate",)
    # dotted config field -> the values the plugin implements (``accepted_config``): a config
    # with another value is refused when the engine is built, never run as something else
    accepted_config: dict[str, tuple] = dataclasses.field(default_factory=dict)

    def capability(self, name: str) -> Capability:
        return self.capabilities.get(name, Capability("unsupported", "not declared by the plugin"))

    def load_model_class(self) -> Any:
        return import_string(self.model, f"model of {self.architecture} (plugin {self.plugin!r})")

    def load_model_state_class(self) -> Any:
        return import_string(self.model_state, f"model_state of {self.architecture} (plugin {self.plugin!r})")


def import_string(spec: str, what: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what}: {spec!r} is not a 'module:attr' string")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{what}: cannot import {spec!r}: {e}") from e


def builtin_table() -> dict[str, dict]:
    """The ``[architectures.*]`` tables of registry.toml."""
    path = Path(__file__).with_name("registry.toml")
    with open(path, "rb") as f:
        return tomllib.load(f).get("architectures", {})


def _check_lazy(name: str, value: Any) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"{name}={value!r} is invalid: expected a lazy 'module:attr' string")
    return value


def _check_accepted(architecture: str, accepted: dict | None) -> dict[str, tuple]:
    out = {}
    for k, v in (accepted or {}).items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"accepted_config of {architecture}: key {k!r} is not a config field name")
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"accepted_config of {architecture}: {k}={v!r} is invalid: expected a non-empty list "
                             "of the values the plugin implements")
        out[k] = tuple(v)
    return out


@dataclass(frozen=True)
class DraftRegistration:
    """A draft model for speculative decoding (``core_runner.draft_model.DraftModel``):
    keyed by (architecture, method). For "mtp" the architecture is the target's (the
    draft lives in the target's checkpoint); for "eagle" / "eagle3" it is the draft
    checkpoint's own ``architectures[0]``."""
    architecture: str
    method: str
    model: str
    plugin: str = "<direct>"

    def load_model_class(self) -> Any:
        return import_string(self.model, f"draft model of {self.architecture} ({self.method})")


class Registry:
    def __init__(self) -> None:
        self._regs: dict[str, Registration] = {}
        self._drafts: dict[tuple[str, str], DraftRegistration] = {}
        self.current_plugin = "<direct>"
        # plugin name -> its load error, filled by the PluginManager; named when a lookup fails
        self.plugin_failures: dict[str, str] = {}

    def snapshot(self) -> tuple[dict, dict]:
        """A copy of the registrations, for ``restore`` after a plugin fails half-way."""
        return dict(self._regs), dict(self._drafts)

    def restore(self, snapshot: tuple[dict, dict]) -> None:
        self._regs, self._drafts = dict(snapshot[0]), dict(snapshot[1])

    def add_draft(self, architecture: str, method: str, model: str, *, override: bool = False,
                  sdk_version: str | None = None) -> None:
        """Register a draft model for ``method`` ("mtp", "eagle" or "eagle3", see
        ``DraftRegistration``). A duplicate is an error unless ``override=True``."""
        from core_runner.speculative_config import DRAFT_METHODS

        check_sdk_range(sdk_version, self.current_plugin, f"{method} draft of {architecture}")
        if method not in DRAFT_METHODS:
            raise ValueError(f"draft method {method!r} of {architecture} is unknown: expected one of {DRAFT_METHODS}")
        key = (architecture, method)
        if key in self._drafts and not override:
            raise ValueError(f"a {method!r} draft for {architecture!r} from plugin {self.current_plugin!r} is already "
                             f"registered by plugin {self._drafts[key].plugin!r}; pass override=True to replace it")
        self._drafts[key] = DraftRegistration(architecture, method, _check_lazy("model", model), self.current_plugin)

    def find_draft(self, architecture: str, method: str) -> DraftRegistration | None:
        return self._drafts.get((architecture, method))

    def get_draft(self, architecture: str, method: str) -> DraftRegistration:
        """The draft registered for (architecture, method); a ValueError naming what exists."""
        found = self._drafts.get((architecture, method))
        if found is None:
            known = sorted(f"{a} ({m})" for a, m in self._drafts)
            where = ("the target architecture" if method == "mtp" else "the draft checkpoint's architecture")
            raise ValueError(f"no {method!r} draft model is registered for {where} {architecture!r}: installed "
                             f"plugins register draft models for {known or 'nothing'}")
        return found

    def add(
        self, architecture: str, model: str, model_state: str, *, capabilities: dict | None = None,
        reference: str | None = None, examples: list | tuple = (), tasks: tuple[str, ...] = ("generate",),
        override: bool = False, accepted_config: dict | None = None,
        sdk_version: str | None = None,
    ) -> None:
        """Register an architecture. A duplicate is an error unless ``override=True``.
        ``accepted_config`` maps a (dotted) config field to the values the plugin implements,
        e.g. ``{"use_sliding_window": [False]}``: the engine refuses a checkpoint whose config
        holds another value, naming the field."""
        # sdk_version: the core_runner.sdk range the plugin needs (">=1.0,<2"); refused if it excludes this SDK
        check_sdk_range(sdk_version, self.current_plugin, f"architecture {architecture}")
        if architecture in self._regs and not override:
            prev = self._regs[architecture]
            raise ValueError(
                f"architecture {architecture!r} from plugin {self.current_plugin!r} is already registered "
                f"by plugin {prev.plugin!r}; pass override=True to replace it"
            )
        caps = {}
        for k, v in (capabilities or {}).items():
            if k not in CAPABILITIES:
                raise ValueError(f"capability {k!r} of {architecture} is unknown: expected one of {CAPABILITIES}")
            caps[k] = Capability.parse(k, v)
        self._regs[architecture] = Registration(
            architecture=architecture, model=_check_lazy("model", model),
            model_state=_check_lazy("model_state", model_state), capabilities=caps,
            reference=reference, examples=tuple(examples), plugin=self.current_plugin, tasks=tuple(tasks),
            accepted_config=_check_accepted(architecture, accepted_config), sdk_version=sdk_version,
        )

    def architectures(self) -> list[str]:
        return sorted(self._regs)

    def registrations(self) -> list[Registration]:
        return [self._regs[a] for a in self.architectures()]

    def by_plugin(self, plugin: str) -> list[Registration]:
        return [r for r in self.registrations() if r.plugin == plugin]

    def find(self, architecture: str) -> Registration | None:
        """The registration of ``architecture``, or None if nothing registered it (``get``
        raises instead, naming the plugin that would provide it)."""
        return self._regs.get(architecture)

    def get(self, architecture: str) -> Registration:
        """The registration of ``architecture``; a ValueError that names the package that
        provides it, or the plugins that failed to load (one of them may provide it)."""
        if architecture in self._regs:
            return self._regs[architecture]
        failed = "".join(f"; plugin {name!r} failed to load: {err}: it may provide it"
                         for name, err in sorted(self.plugin_failures.items()))
        known = builtin_table().get(architecture)
        if known is not None:
            if known["plugin"] in self.plugin_failures:
                raise ValueError(f"architecture {architecture!r} is not registered{failed}")
            raise ValueError(
                f"architecture {architecture!r} is provided by the plugin package {known['package']!r}, "
                f"which is not installed: pip install {known['package']} "
                f"(or pip install -e plugins/{known['plugin']} from a checkout){failed}"
            )
        if failed:
            raise ValueError(f"architecture {architecture!r} is not registered{failed}; installed plugins "
                             f"provide {self.architectures()}")
        raise ValueError(
            f"architecture {architecture!r} is unknown: installed plugins provide {self.architectures()}; "
            f"built-in plugins exist for {sorted(builtin_table())}"
        )
