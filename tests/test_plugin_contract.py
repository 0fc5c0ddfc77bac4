"""The versioned plugin contract (docs/plugin_contract.md): a registration's ``sdk_version``
range is checked against ``core_runner.sdk.SDK_VERSION`` when it registers; an incompatible
or malformed range is refused by name and recorded as a plugin fault; every built-in plugin
declares a range that accepts this SDK; the conformance report names the SDK it checked."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import fake_plugin_dist
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import core_runner.sdk as sdk
from core_runner.plugins import PluginError, load_plugins
from core_runner.registry import Registry
from core_runner.sdk_version import SDK_VERSION

NEXT_MAJOR = f">={Version(SDK_VERSION).major + 1}.0,<{Version(SDK_VERSION).major + 2}"

PLUGIN_NEEDING_NEXT_MAJOR = f"""
from core_runner.sdk import hookimpl

@hookimpl
def register_models(registry):
    registry.add("FutureForCausalLM", "future_mod:M", "future_mod:S", sdk_version={NEXT_MAJOR!r})
"""


def test_sdk_exports_a_semantic_version():
    assert sdk.SDK_VERSION == sdk.__version__ == SDK_VERSION and "SDK_VERSION" in sdk.__all__
    assert len(Version(SDK_VERSION).release) == 3, "MAJOR.MINOR.PATCH"


@pytest.mark.parametrize("spec", [f">={SDK_VERSION}", ">=1.0,<2", f"=={Version(SDK_VERSION).major}.*", None])
def test_compatible_range_is_accepted_and_recorded(spec):
    registry = Registry()
    registry.add("OkForCausalLM", "m:M", "m:S", sdk_version=spec)
    registry.add_draft("OkForCausalLM", "mtp", "m:D", sdk_version=spec)
    assert registry.get("OkForCausalLM").sdk_version == spec
    assert registry.find_draft("OkForCausalLM", "mtp") is not None


def test_incompatible_range_is_refused_naming_plugin_and_both_versions():
    registry = Registry()
    registry.current_plugin = "future"
    with pytest.raises(ValueError) as info:
        registry.add("FutureForCausalLM", "m:M", "m:S", sdk_version=NEXT_MAJOR)
    msg = str(info.value)
    assert "'future'" in msg and "FutureForCausalLM" in msg and NEXT_MAJOR in msg and SDK_VERSION in msg, msg
    assert registry.find("FutureForCausalLM") is None
    with pytest.raises(ValueError, match=f"needs core_runner.sdk {NEXT_MAJOR} but .* SDK {SDK_VERSION}"):
        registry.add_draft("FutureForCausalLM", "mtp", "m:D", sdk_version=NEXT_MAJOR)
    assert registry.find_draft("FutureForCausalLM", "mtp") is None


@pytest.mark.parametrize("spec", ["1.0", ">>1", "", "  ", ">=1.0;<2", 1.0])
def test_malformed_range_is_refused_naming_it(spec):
    with pytest.raises(ValueError) as info:
        Registry().add("BadForCausalLM", "m:M", "m:S", sdk_version=spec)
    assert f"sdk_version={spec!r} is not a version range" in str(info.value)
    assert "'>=1.0,<2'" in str(info.value)  # what a valid one looks like


def test_incompatible_plugin_is_a_recorded_fault(tmp_path, monkeypatch):
    fake_plugin_dist(tmp_path, "future", "future_mod", PLUGIN_NEEDING_NEXT_MAJOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CORE_RUNNER_STRICT", raising=False)
    monkeypatch.delenv("CORE_RUNNER_PLUGINS", raising=False)
    pm = load_plugins()
    assert "future" not in pm.plugins and "FutureForCausalLM" not in pm.registry.architectures()
    assert NEXT_MAJOR in pm.failures["future"] and SDK_VERSION in pm.failures["future"]
    assert "Qwen3ForCausalLM" in pm.registry.architectures(), "the compatible plugins still load"
    with pytest.raises(PluginError, match="needs core_runner.sdk"):
        load_plugins(["future"])  # by name: fatal


def test_builtin_plugins_declare_a_range_that_accepts_this_sdk():
    builtin = ["qwen3", "deepseek", "granite_hybrid", "pooling", "mistral", "gemma", "gpt_oss", "mamba",
               "llama_template"]
    pm = load_plugins(builtin)
    regs = pm.registry.registrations()
    assert {r.plugin for r in regs} == set(builtin)
    for reg in regs:
        assert reg.sdk_version is not None, f"{reg.plugin}: {reg.architecture} declares no sdk_version"
        assert SpecifierSet(reg.sdk_version).contains(SDK_VERSION), (reg.plugin, reg.sdk_version)


def test_conformance_report_records_the_sdk_version():
    from core_runner.conformance.report import versions

    got = versions(SimpleNamespace(plugin_name="qwen3", from_module=False, pm=None))
    assert got["sdk"] == SDK_VERSION and got["plugin"]["distribution"] == "core-runner-qwen3"


def test_cli_plugins_shows_the_sdk_and_each_range(capsys):
    from core_runner.cli import main

    main(["plugins"])
    out = capsys.readouterr().out
    assert f"core_runner.sdk {SDK_VERSION}" in out
    assert "Qwen3ForCausalLM tasks=generate reference=transformers:Qwen3ForCausalLM sdk=>=1.4,<2" in out
