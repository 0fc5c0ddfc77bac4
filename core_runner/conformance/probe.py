"""Load one plugin in a fresh process and say what registering it did.

``python -m core_runner.conformance.probe (--entry-point NAME | --module MOD --name NAME)``
prints one JSON object: the architectures registered, the modules the registration
imported, whether torch.cuda was initialised (or asked to be), and how many
``nn.Module`` objects were constructed. The suite's registration checks read it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--entry-point")
    p.add_argument("--module")
    p.add_argument("--name")
    a = p.parse_args(argv)

    import torch

    seen = {"cuda_init_calls": 0, "modules_built": 0, "module_types": set()}
    lazy_init = torch.cuda._lazy_init

    def counting_lazy_init(*args, **kw):
        seen["cuda_init_calls"] += 1
        return lazy_init(*args, **kw)

    module_init = torch.nn.Module.__init__

    def counting_module_init(self, *args, **kw):
        seen["modules_built"] += 1
        seen["module_types"].add(f"{type(self).__module__}.{type(self).__qualname__}")
        return module_init(self, *args, **kw)

    torch.cuda._lazy_init = counting_lazy_init
    torch.nn.Module.__init__ = counting_module_init

    from core_runner.plugins import PluginManager

    before = set(sys.modules)
    result: dict = {"ok": False, "error": None, "architectures": [], "registrations": {}, "version": None}
    pm = PluginManager()
    try:
        if a.entry_point:
            pm.load_entry_points([a.entry_point])
            name = a.entry_point
        else:
            name = a.name or a.module
            pm.register_module(name, importlib.import_module(a.module))
        regs = pm.registry.by_plugin(name)
        result["ok"] = bool(regs)
        result["architectures"] = [r.architecture for r in regs]
        result["registrations"] = {r.architecture: {"model": r.model, "model_state": r.model_state} for r in regs}
        result["version"] = pm.plugins.get(name, {}).get("version")
    except Exception as e:  # reported, not raised: the parent turns it into a check failure
        result["error"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=6)
    result["new_modules"] = sorted(set(sys.modules) - before)
    result["cuda_initialized"] = bool(torch.cuda.is_initialized())
    result["cuda_init_calls"] = seen["cuda_init_calls"]
    result["modules_built"] = seen["modules_built"]
    result["module_types"] = sorted(seen["module_types"])[:20]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
