"""A broken plugin beside good ones: recorded and reported, the good ones' models still load;
strict mode (and loading the plugin by name, as the conformance suite does) makes it fatal."""
from __future__ import annotations

import json
import logging

import pytest
from helpers import fake_plugin_dist

from core_runner import LLM
from core_runner.plugins import PluginError, load_plugins

SMALL = {"dtype": "float32", "device": "cpu", "max_model_len": 32, "max_num_seqs": 2, "block_size": 4,
         "num_kv_blocks": 16}

HALF_REGISTERS = """
from core_runner.sdk import hookimpl

@hookimpl
def register_models(registry):
    registry.add("HalfForCausalLM", "half_mod:M", "half_mod:S")
    raise KeyError("second architecture")
"""


@pytest.fixture()
def broken(tmp_path, monkeypatch):
    """Two broken plugins installed beside the built-in ones: one fails to import, one
    raises after registering one architecture."""
    fake_plugin_dist(tmp_path, "broken", "broken_plugin_mod", "raise ImportError('no module named missing_dep')\n")
    fake_plugin_dist(tmp_path, "half", "half_mod", HALF_REGISTERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("CORE_RUNNER_STRICT", raising=False)
    monkeypatch.delenv("CORE_RUNNER_PLUGINS", raising=False)


def test_broken_plugins_are_recorded_and_the_others_load(broken, caplog):
    with caplog.at_level(logging.ERROR, logger="core_runner.plugins"):
        pm = load_plugins()
    assert "qwen3" in pm.plugins and "Qwen3ForCausalLM" in pm.registry.architectures()
    assert set(pm.failures) == {"broken", "half"}
    assert pm.failures["broken"] == "ImportError: no module named missing_dep"
    assert pm.failures["half"].startswith("KeyError:")
    assert "HalfForCausalLM" not in pm.registry.architectures(), "a half-registered plugin leaves nothing behind"
    assert "half" not in pm.plugins and pm.pm.get_plugin("half") is None
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'broken'" in m and "failed to import" in m for m in logged)
    assert any("'half'" in m and "raised while registering" in m for m in logged)


def test_good_models_still_load_beside_a_broken_plugin(broken, untied):
    llm = LLM(untied.path, **SMALL)  # loads the entry points itself
    assert "broken" in llm.engine.plugins.failures
    assert len(llm.generate([[1, 2, 3]])[0].token_ids) >= 1


def test_not_found_error_names_the_broken_plugins(broken):
    pm = load_plugins()
    with pytest.raises(ValueError) as info:
        pm.registry.get("MysteryForCausalLM")
    msg = str(info.value)
    assert msg.startswith("architecture 'MysteryForCausalLM' is not registered; plugin 'broken' failed to load: "
                          "ImportError: no module named missing_dep: it may provide it")
    assert "plugin 'half' failed to load: KeyError" in msg


def test_cli_plugins_lists_the_failure(broken, capsys):
    from core_runner.cli import main

    assert main(["plugins"]) == 1
    out = capsys.readouterr().out
    assert "broken: FAILED TO LOAD: ImportError: no module named missing_dep" in out
    assert "qwen3 " in out and "Qwen3ForCausalLM" in out
    assert main(["plugins", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    failed = {r["plugin"]: r["error"] for r in rows if r.get("failed")}
    assert set(failed) == {"broken", "half"}
    assert any(r["architecture"] == "Qwen3ForCausalLM" for r in rows)


def test_strict_mode_makes_a_broken_plugin_fatal(broken, untied, monkeypatch):
    either = r"plugin (entry point )?'(broken|half)'"  # whichever the entry-point order reaches first
    with pytest.raises(PluginError, match=either):
        load_plugins(strict=True)
    with pytest.raises(PluginError, match=either):
        LLM(untied.path, strict=True, **SMALL)
    monkeypatch.setenv("CORE_RUNNER_STRICT", "1")
    with pytest.raises(PluginError, match=either):
        load_plugins()


def test_the_conformance_suite_still_fails_a_broken_plugin_by_name(broken):
    from core_runner.conformance import run_suite

    report = run_suite("broken", checks=["CR-REG-01"], tier="cpu")
    assert report["exit_code"] == 1
    reg = next(c for c in report["checks"] if c["name"].startswith("CR-REG-01"))
    assert reg["outcome"] == "failed"
    assert "'broken'" in reg["message"] and "ImportError: no module named missing_dep" in reg["message"]
