"""Plugin discovery: pluggy hooks loaded from the ``core_runner`` entry-point group.

A plugin module implements ``register_models(registry)`` with ``@hookimpl``. Loading
can be narrowed with ``CORE_RUNNER_PLUGINS=name1,name2``.

A plugin that fails to import, raises while registering, or registers nothing is a
fault: outside strict mode it is logged as an error, recorded in
``PluginManager.failures`` (shown by ``core-runner plugins``, and named in the error for
an architecture nobody registered), and the other plugins' models still load. In strict
mode (``strict=True`` or ``CORE_RUNNER_STRICT=1``), and for plugins loaded by name
(``load_plugins(["name"])``, as the conformance suite does), it raises PluginError.
"""
from __future__ import annotations

import logging
import os
from importlib.metadata import PackageNotFoundError, entry_points, version
from types import ModuleType
from typing import Iterable

import pluggy

from core_runner.config import strict_from_env
from core_runner.registry import Registry

GROUP = "core_runner"
hookspec = pluggy.HookspecMarker(GROUP)
hookimpl = pluggy.HookimplMarker(GROUP)
logger = logging.getLogger(__name__)


class PluginError(RuntimeError):
    """A plugin could not be loaded or registered nothing usable."""


class Hookspecs:
    @hookspec
    def register_models(self, registry: Registry) -> None:
        """Add architectures with ``registry.add(...)``."""


def plugin_entry_points(names: Iterable[str] | None = None) -> list:
    eps = list(entry_points(group=GROUP))
    wanted = set(names) if names is not None else None
    env = os.environ.get("CORE_RUNNER_PLUGINS")
    if wanted is None and env:
        wanted = {n.strip() for n in env.split(",") if n.strip()}
    if wanted is not None:
        found = {ep.name for ep in eps}
        missing = wanted - found
        if missing:
            raise PluginError(
                f"plugin entry point(s) {sorted(missing)} not found in group {GROUP!r}; "
                f"installed: {sorted(found)}"
            )
        eps = [ep for ep in eps if ep.name in wanted]
    return eps


def dist_version(ep: object) -> str:
    dist = getattr(ep, "dist", None)
    if dist is not None:
        return dist.version
    try:
        return version(ep.value.split(".")[0])
    except PackageNotFoundError:
        return "unknown"


class PluginManager:
    """Loads plugins and collects their registrations into one Registry."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(GROUP)
        self.pm.add_hookspecs(Hookspecs)
        self.registry = Registry()
        self.plugins: dict[str, dict] = {}
        # entry-point name -> "ErrorType: message" of plugins that failed (non-strict loading);
        # the registry reads it to name them when an architecture is not found
        self.failures: dict[str, str] = self.registry.plugin_failures

    def register_module(self, name: str, module: ModuleType | object, version: str = "unknown") -> None:
        """Register one plugin object and run its ``register_models`` hook. A failure raises
        PluginError and leaves nothing of the plugin behind (its partial registrations too)."""
        try:
            self.pm.register(module, name=name)
        except Exception as e:
            raise PluginError(f"plugin {name!r} could not be registered with pluggy: {e}") from e
        others = [p for p in self.pm.get_plugins() if p is not module]
        caller = self.pm.subset_hook_caller("register_models", remove_plugins=others)
        before = self.registry.snapshot()
        self.registry.current_plugin = name
        try:
            try:
                caller(registry=self.registry)
            except Exception as e:
                raise PluginError(
                    f"plugin {name!r} raised while registering models: {type(e).__name__}: {e}"
                ) from e
            finally:
                self.registry.current_plugin = "<direct>"
            added = [r.architecture for r in self.registry.by_plugin(name)]
            new_drafts = self.registry.snapshot()[1].keys() - before[1].keys()
            if not added and not (set(self.registry.architectures()) - set(before[0])) and not new_drafts:
                raise PluginError(f"plugin {name!r} registered no architecture nor draft model (does it implement "
                                  "register_models?)")
        except PluginError:
            self.registry.restore(before)
            self.pm.unregister(module, name=name)
            raise
        self.plugins[name] = {"version": version, "architectures": added}

    def load_entry_points(self, names: Iterable[str] | None = None, strict: bool | None = None) -> None:
        """Load the group's entry points (or those named). ``strict`` None means strict when
        plugins are named (asking for a plugin and not getting it is an error) and
        otherwise ``CORE_RUNNER_STRICT``. Outside strict mode a broken plugin is logged and
        recorded in ``failures``, and loading goes on."""
        if strict is None:
            strict = names is not None or strict_from_env()
        for ep in plugin_entry_points(names):
            try:
                try:
                    module = ep.load()
                except Exception as e:
                    raise PluginError(
                        f"plugin entry point {ep.name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}"
                    ) from e
                self.register_module(ep.name, module, dist_version(ep))
            except PluginError as e:
                if strict:
                    raise
                cause = e.__cause__
                self.failures[ep.name] = f"{type(cause).__name__}: {cause}" if cause else str(e)
                logger.error("%s; its models are unavailable, the other plugins still load "
                             "(CORE_RUNNER_STRICT=1 makes this fatal)", e)


def load_plugins(names: Iterable[str] | None = None, strict: bool | None = None) -> PluginManager:
    """A PluginManager with the ``core_runner`` entry points loaded (see ``load_entry_points``)."""
    pm = PluginManager()
    pm.load_entry_points(names, strict)
    return pm
