"""``accepted_config``: a family declares the config values it implements, and the engine
refuses any other at construction, naming the field (never runs something else)."""
from __future__ import annotations

import pytest

from core_runner.conformance.harness import Example, Reference, examples_of
from core_runner.oracle import UnsupportedError, check_config, config_value
from core_runner.plugins import load_plugins
from core_runner.registry import Registry

pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")


def test_registration_validates_the_declaration():
    r = Registry()
    r.add("A", "m:M", "s:S", accepted_config={"use_sliding_window": [False], "rope_parameters.rope_type": ("default",)})
    assert r.get("A").accepted_config == {"use_sliding_window": (False,), "rope_parameters.rope_type": ("default",)}
    with pytest.raises(ValueError, match=r"accepted_config of B: use_sliding_window=False is invalid"):
        r.add("B", "m:M", "s:S", accepted_config={"use_sliding_window": False})
    with pytest.raises(ValueError, match="non-empty list"):
        r.add("C", "m:M", "s:S", accepted_config={"hidden_act": []})


def test_dotted_fields_read_nested_dicts_and_attributes():
    class Cfg:
        hidden_act = "silu"
        rope_parameters = {"rope_type": "yarn"}

    assert config_value(Cfg(), "hidden_act") == "silu"
    assert config_value(Cfg(), "rope_parameters.rope_type") == "yarn"
    reg = Registry()
    reg.add("A", "m:M", "s:S", accepted_config={"rope_parameters.rope_type": ["default"], "absent": [1]})
    with pytest.raises(UnsupportedError, match=r"rope_parameters.rope_type='yarn' is not implemented by A .*"
                                               r"accepts rope_parameters.rope_type in \['default'\]"):
        check_config(Cfg(), reg.get("A"))


def test_engine_refuses_a_config_outside_the_declaration(tmp_path):
    from core_runner import LLM

    reg = load_plugins().registry.get("Qwen3ForCausalLM")
    ex = examples_of(reg)[0]
    gelu = Reference(reg, Example("gelu", {**ex.config, "hidden_act": "gelu"}), tmp_path)
    with pytest.raises(UnsupportedError, match=r"hidden_act='gelu' is not implemented by Qwen3ForCausalLM "
                                               r"\(plugin 'qwen3'\)"):
        LLM(str(gelu.path), device="cpu", dtype="float32", max_model_len=64, num_kv_blocks=64)
    plain = Reference(reg, ex, tmp_path)
    llm = LLM(str(plain.path), device="cpu", dtype="float32", max_model_len=64, num_kv_blocks=64)
    assert llm.engine.registration.accepted_config["hidden_act"] == ("silu",)
