"""Plugin discovery, registry rules and the capability oracle."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from core_runner import hookimpl
from core_runner.config import EngineConfig
from core_runner.oracle import UnsupportedError, plan_execution
from core_runner.plugins import PluginError, PluginManager, load_plugins
from core_runner.registry import Registry


def test_qwen3_discovered_through_entry_point():
    pm = load_plugins()
    assert "qwen3" in pm.plugins
    reg = pm.registry.get("Qwen3ForCausalLM")
    assert reg.plugin == "qwen3"
    assert reg.capability("chunked_prefill").supported
    assert pm.plugins["qwen3"]["version"] == "0.1.0"


def test_registration_imports_no_model_code():
    code = textwrap.dedent("""
        import sys
        from core_runner.plugins import load_plugins
        pm = load_plugins()
        assert "Qwen3ForCausalLM" in pm.registry.architectures()
        print(sorted(m for m in sys.modules if m.startswith("core_runner_qwen3")))
        print("torch.cuda initialised:", "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "core_runner_qwen3.model" not in out
    assert "torch.cuda initialised: True" not in out


def _plugin(arch: str, **kw):
    class P:
        @hookimpl
        def register_models(self, registry):
            registry.add(architecture=arch, model="m:M", model_state="s:S", **kw)
    return P()


def test_duplicate_architecture_is_an_error_unless_override():
    pm = PluginManager()
    pm.register_module("first", _plugin("X"))
    with pytest.raises(PluginError, match="'X'.*already registered by plugin 'first'.*override=True"):
        pm.register_module("second", _plugin("X"))
    pm2 = PluginManager()
    pm2.register_module("first", _plugin("X"))
    pm2.register_module("second", _plugin("X", override=True))
    assert pm2.registry.get("X").plugin == "second"


def test_find_returns_the_registration_or_none():
    pm = PluginManager()
    assert pm.registry.find("X") is None
    pm.register_module("first", _plugin("X"))
    assert pm.registry.find("X") is pm.registry.get("X")
    assert pm.registry.find("X").plugin == "first"
    pm.register_module("second", _plugin("X", override=True))
    assert pm.registry.find("X").plugin == "second"
    assert pm.registry.find("Qwen3ForCausalLM") is None  # built in, not installed here: get would raise


def test_plugin_registering_nothing_is_an_error():
    class Empty:
        @hookimpl
        def register_models(self, registry):
            return None

    with pytest.raises(PluginError, match="'empty' registered no architecture"):
        PluginManager().register_module("empty", Empty())


def test_bad_capability_and_lazy_strings_rejected():
    r = Registry()
    with pytest.raises(ValueError, match="capability 'graphs' of A is unknown"):
        r.add("A", "m:M", "s:S", capabilities={"graphs": "supported"})
    with pytest.raises(ValueError, match="capability cuda_graphs='maybe' is invalid"):
        r.add("A", "m:M", "s:S", capabilities={"cuda_graphs": "maybe"})
    with pytest.raises(ValueError, match="lazy 'module:attr'"):
        r.add("A", object(), "s:S")
    r.add("A", "m:M", "s:S", capabilities={"cuda_graphs": "xfail: capture breaks on odd sizes"})
    cap = r.get("A").capability("cuda_graphs")
    assert (cap.state, cap.reason) == ("xfail", "capture breaks on odd sizes")


def test_unknown_architecture_names_what_exists():
    r = Registry()
    with pytest.raises(ValueError, match="'NopeForCausalLM' is unknown.*Qwen3ForCausalLM"):
        r.get("NopeForCausalLM")


def test_builtin_architecture_without_its_plugin_names_the_package():
    with pytest.raises(ValueError, match="pip install core-runner-qwen3"):
        PluginManager().registry.get("Qwen3ForCausalLM")


def _fake_dist(tmp_path, ep_name: str, module_name: str, module_src: str):
    (tmp_path / f"{module_name}.py").write_text(module_src)
    dist = tmp_path / f"fake_{ep_name}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-{ep_name}\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text(f"[core_runner]\n{ep_name} = {module_name}\n")


def test_entry_point_that_raises_on_import_fails_loudly_when_strict_or_named(tmp_path, monkeypatch):
    # non-strict loading records the fault instead: tests/test_plugin_faults.py
    _fake_dist(tmp_path, "broken", "broken_plugin_mod", "raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"'broken' \(broken_plugin_mod\) failed to import: RuntimeError: boom"):
        load_plugins(strict=True)
    with pytest.raises(PluginError, match=r"'broken' \(broken_plugin_mod\) failed to import"):
        load_plugins(["broken"])
    # narrowing to the healthy plugin still works
    assert "qwen3" in load_plugins(["qwen3"]).plugins


def test_missing_entry_point_name_is_an_error():
    with pytest.raises(PluginError, match=r"\['nope'\] not found"):
        load_plugins(["nope"])


def test_cli_plugins_lists_capabilities():
    out = subprocess.run([sys.executable, "-m", "core_runner.cli", "plugins", "--json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    row = next(r for r in rows if r["architecture"] == "Qwen3ForCausalLM")
    assert row["plugin"] == "qwen3" and row["capabilities"]["prefix_caching"] == "supported"


def _reg(**caps):
    r = Registry()
    r.add("A", "m:M", "s:S", capabilities=caps)
    return r.get("A")


def test_oracle_cpu_plan_and_chunked_prefill_rules():
    cfg = EngineConfig(model="x", max_model_len=64, max_num_batched_tokens=16)
    plan = plan_execution(cfg, _reg(chunked_prefill="supported"))
    assert plan.attention_backend == "torch" and not plan.cuda_graphs and plan.chunked_prefill
    with pytest.raises(UnsupportedError, match="max_num_batched_tokens=16 < max_model_len=64 needs chunked"):
        plan_execution(cfg, _reg(chunked_prefill="unsupported"))
    big = EngineConfig(model="x", max_model_len=64, max_num_batched_tokens=64)
    assert not plan_execution(big, _reg(chunked_prefill="unsupported")).chunked_prefill


def test_oracle_logs_downgrades_and_strict_mode_raises(caplog):
    reg = _reg(chunked_prefill="supported", triton_attention="unsupported")
    cfg = EngineConfig(model="x", device="cuda", enforce_eager=True)
    with caplog.at_level("WARNING"):
        plan = plan_execution(cfg, reg)
    assert plan.attention_backend == "torch"
    assert any(line.startswith("Triton attention off: A declares triton_attention unsupported")
               for line in plan.downgrades)
    assert "Triton attention off" in caplog.text
    strict = EngineConfig(model="x", device="cuda", enforce_eager=True, strict=True)
    with pytest.raises(UnsupportedError, match="strict mode: Triton attention off"):
        plan_execution(strict, reg)


def test_strict_from_environment(monkeypatch):
    monkeypatch.setenv("CORE_RUNNER_STRICT", "1")
    assert EngineConfig(model="x").strict
    monkeypatch.setenv("CORE_RUNNER_STRICT", "0")
    assert not EngineConfig(model="x").strict
