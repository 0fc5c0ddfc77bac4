"""CR-REG-*: loading and registering a plugin."""
from __future__ import annotations

from importlib.metadata import entry_points

import torch

from core_runner.conformance.harness import Ctx, examples_of, fail, reference_class, reference_config
from core_runner.plugins import GROUP, PluginError, PluginManager, hookimpl
from core_runner.registry import CAPABILITIES, Registry, builtin_table

MIN_POSITIONS = 64  # the suite's workloads need max_model_len up to 64


def _probe(ctx: Ctx) -> dict:
    result = ctx.session.fresh_process_probe()
    if result.get("not_run"):
        import pytest

        pytest.skip(f"not run: {result['not_run']}")
    if not result["ok"]:
        fail(f"the plugin did not load in a fresh process, so this cannot be checked: {result['error']}")
    return result


def fresh_process_load(ctx: Ctx) -> None:
    s = ctx.session
    if s.load_error is not None:
        fail(f"plugin {s.plugin_name!r} did not load in this process: {s.load_error}")
    res = ctx.session.fresh_process_probe()
    if res.get("not_run"):
        import pytest

        pytest.skip(f"not run: {res['not_run']}")
    if res["error"] or not res["ok"]:
        fail(f"plugin {s.plugin_name!r} did not load in a fresh process: {res['error'] or 'no architectures'}\n"
             f"{res.get('traceback', '')}")
    here = sorted(r.architecture for r in s.registrations)
    if sorted(res["architectures"]) != here:
        fail(f"a fresh process registered {sorted(res['architectures'])}, this process {here}: registration "
             "depends on import order or global state")
    ctx.note(f"fresh process registered {here}")


def no_cuda_at_registration(ctx: Ctx) -> None:
    res = _probe(ctx)
    if res["cuda_initialized"] or res["cuda_init_calls"]:
        fail(f"registering plugin {ctx.session.plugin_name!r} initialised CUDA "
             f"(torch.cuda._lazy_init called {res['cuda_init_calls']} times): keep torch.cuda out of hooks.py")


def no_model_at_registration(ctx: Ctx) -> None:
    res = _probe(ctx)
    imported = set(res["new_modules"])
    bad = []
    for arch, r in res["registrations"].items():
        mods = [r["model"].partition(":")[0]]
        state_mod = r["model_state"].partition(":")[0]
        if not state_mod.startswith("model_states."):
            mods.append(state_mod)
        bad += [f"{m} ({arch})" for m in mods if m in imported]
    if bad:
        fail(f"registering imported model code: {bad}; registrations must name it lazily ('module:attr')")
    if res["modules_built"]:
        fail(f"registering constructed {res['modules_built']} nn.Module objects ({res['module_types']}): "
             "build nothing at registration")


class _RecordingRegistry(Registry):
    def __init__(self) -> None:
        super().__init__()
        self.overrides: list[tuple[str, str]] = []

    def add(self, architecture: str, *args, override: bool = False, **kw) -> None:
        if override:
            prev = self.find(architecture)
            self.overrides.append((architecture, prev.plugin if prev else "<nothing>"))
        super().add(architecture, *args, override=override, **kw)


def _recording_pm() -> PluginManager:
    pm = PluginManager()
    pm.registry = _RecordingRegistry()
    return pm


class _Again:
    """The plugin's own hook implementations, registered a second time under another name."""

    def __init__(self, functions: list) -> None:
        self.functions = functions

    @hookimpl
    def register_models(self, registry: Registry) -> None:
        for fn in self.functions:
            fn(registry=registry)


def no_silent_override(ctx: Ctx) -> None:
    s = ctx.session
    if s.plugin_obj is None:
        fail(f"plugin {s.plugin_name!r} did not load: {s.load_error}")
    # 1. beside every installed plugin
    pm = _recording_pm()
    others = [ep for ep in entry_points(group=GROUP) if ep.name != s.plugin_name]
    for ep in others:
        try:
            pm.register_module(ep.name, ep.load())
        except Exception as e:  # another plugin's own failure is not this plugin's
            ctx.note(f"installed plugin {ep.name!r} does not load on its own: {e}")
    try:
        pm.register_module(s.plugin_name, s.plugin_obj)
    except PluginError as e:
        fail(f"plugin {s.plugin_name!r} cannot load beside the installed plugins "
             f"{[ep.name for ep in others]}: {e}")
    for arch, prev in pm.registry.overrides:
        ctx.note(f"{arch}: registered with override=True (replaces {prev})")
    # 2. registering the same architectures again must be refused unless override=True
    pm = _recording_pm()
    pm.register_module(s.plugin_name, s.plugin_obj)
    declared_override = {a for a, _ in pm.registry.overrides}
    archs = [r.architecture for r in pm.registry.by_plugin(s.plugin_name)]
    plain = [a for a in archs if a not in declared_override]
    try:
        impls = [i.function for i in s.pm.pm.hook.register_models.get_hookimpls() if i.plugin is s.plugin_obj]
        pm.register_module(f"{s.plugin_name}-again", _Again(impls))
    except PluginError as e:
        if not plain:
            fail(f"every registration says override=True, yet registering again failed: {e}")
        if "already registered" not in str(e):
            fail(f"registering {plain} again failed, but not as a duplicate: {e}")
        return
    if plain:
        fail(f"registering {plain} a second time silently replaced the first registration")


def registration_complete(ctx: Ctx) -> None:
    from core_runner.model_state import ModelState

    reg = ctx.registration
    problems: list[str] = []
    model_cls = state_cls = None
    try:
        model_cls = reg.load_model_class()
    except Exception as e:
        problems.append(f"model: {e}")
    try:
        state_cls = reg.load_model_state_class()
    except Exception as e:
        problems.append(f"model_state: {e}")
    if model_cls is not None:
        if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
            problems.append(f"model {reg.model} is not an nn.Module subclass")
        elif "generate" in reg.tasks and not hasattr(model_cls, "compute_logits"):
            problems.append(f"model {reg.model} has no compute_logits(hidden) but declares task 'generate'")
    if state_cls is not None:
        if not (isinstance(state_cls, type) and issubclass(state_cls, ModelState)):
            problems.append(f"model_state {reg.model_state} is not a core_runner.sdk.ModelState subclass")
        else:
            missing = set(reg.tasks) - set(state_cls.supported_tasks)
            if missing:
                problems.append(f"tasks {sorted(missing)} are declared but {state_cls.__name__} serves "
                                f"{state_cls.supported_tasks}")
    try:
        reference_class(reg)
    except Exception as e:
        problems.append(f"reference: {e}")
    try:
        examples = examples_of(reg)
    except ValueError as e:
        problems.append(str(e))
        examples = []
    if not examples:
        problems.append("no examples: the suite needs at least one tiny config (registry.add(..., examples=[...]))")
    names = [e.name for e in examples]
    if len(set(names)) != len(names):
        problems.append(f"example names are not unique: {names}")
    for ex in examples:
        try:
            cfg = reference_config(reg, ex)
        except Exception as e:
            problems.append(f"example {ex.name!r} does not build a reference config: {type(e).__name__}: {e}")
            continue
        mp = getattr(cfg, "max_position_embeddings", None)
        if mp is not None and mp < MIN_POSITIONS:
            problems.append(f"example {ex.name!r}: max_position_embeddings={mp} < {MIN_POSITIONS} (the suite's "
                            "workloads need that many positions)")
    undeclared = [c for c in CAPABILITIES if c not in reg.capabilities]
    if undeclared:
        ctx.note(f"capabilities {undeclared} are not declared: treated as unsupported")
    table = builtin_table().get(reg.architecture)
    if table is not None and table.get("plugin") == reg.plugin:
        if table.get("reference") != reg.reference:
            problems.append(f"registry.toml says reference {table.get('reference')!r}, the plugin {reg.reference!r}")
        caps = {k: reg.capability(k).state for k in table.get("capabilities", {})}
        declared = {k: str(v).split(":")[0].strip() for k, v in table.get("capabilities", {}).items()}
        if caps != declared:
            problems.append(f"registry.toml capabilities {declared} != the plugin's {caps}")
        if "examples" in table and list(table["examples"]) != names:
            problems.append(f"registry.toml examples {table['examples']} != the plugin's {names}")
        if "tasks" in table and list(table["tasks"]) != list(reg.tasks):
            problems.append(f"registry.toml tasks {table['tasks']} != the plugin's {list(reg.tasks)}")
    if problems:
        fail(f"{reg.architecture}: " + "; ".join(problems))
