"""``--model PATH [--dtype ...]``: the equivalence checks on a checkpoint directory, the
reference loaded by transformers from the same directory (float32), with the per-dtype
tolerances of core_runner/conformance/tolerance.py; per-check timing in every report."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from core_runner.conformance import run_suite
from core_runner.conformance.tolerance import LOW_PRECISION_NATS, Tolerance
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    """A small Qwen3 stored in bfloat16 with a RoPE base the examples never use."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("qwen3-bf16")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=1000, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, initializer_range=0.05,
                      architectures=["Qwen3ForCausalLM"])
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_checkpoint_passes_within_its_dtype_tolerance(bf16_checkpoint, dtype, tmp_path):
    report = run_suite("qwen3", model=str(bf16_checkpoint), dtype=dtype, checks=["CR-EQ-01"], tier="cpu",
                       json_path=str(tmp_path / "r.json"))
    assert report["exit_code"] == 0, report["failing"]
    (eq,) = report["checks"]
    assert eq["name"] == "CR-EQ-01[Qwen3ForCausalLM:checkpoint]" and eq["outcome"] == "passed"
    assert eq["max_logit_error"] <= Tolerance(dtype).limit
    if dtype == "bfloat16":  # bf16 rounding shows (the engine really ran in bf16), well inside the bound
        assert 1e-4 < eq["max_logit_error"] < LOW_PRECISION_NATS["bfloat16"] / 3
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["model"] == str(bf16_checkpoint) and saved["dtype"] == dtype
    assert saved["timing_s"]["CR-EQ-01"] > 0


def test_planted_bug_fails_on_the_checkpoint_in_bf16(bf16_checkpoint):
    pm = PluginManager()
    pm.register_module("hardcoded_theta", importlib.import_module("conformance_fixtures.hardcoded_theta"))
    report = run_suite("hardcoded_theta", pm=pm, model=str(bf16_checkpoint), dtype="bfloat16", checks=["CR-EQ-01"],
                       tier="cpu")
    (eq,) = report["checks"]
    assert eq["outcome"] == "failed" and "log-softmax difference" in eq["message"], eq["message"]
    assert eq["max_logit_error"] > 10 * LOW_PRECISION_NATS["bfloat16"]


def test_checkpoint_of_an_unregistered_architecture_is_refused(bf16_checkpoint, tmp_path):
    cfg = json.loads((bf16_checkpoint / "config.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**cfg, "architectures": ["NoSuchForCausalLM"]}))
    report = run_suite("qwen3", model=str(other), tier="cpu")
    assert report["exit_code"] != 0
    assert any("NoSuchForCausalLM" in f and "Qwen3ForCausalLM" in f for f in report["failing"]), report["failing"]


def test_low_precision_needs_a_checkpoint_and_a_known_dtype():
    with pytest.raises(ValueError, match="needs a checkpoint"):
        run_suite("qwen3", dtype="bfloat16", checks=["CR-EQ-01"])
    with pytest.raises(ValueError, match="float64"):
        Tolerance("float64")


def test_low_precision_measure_ignores_a_shift_and_the_tail():
    want = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0] + [-30.0 - i for i in range(8)])
    tol = Tolerance("bfloat16")
    assert tol.error(want + 3.0, want) < 1e-5  # a constant shift changes no probability
    tail = want.clone()
    tail[-1] = -25.0  # outside the top 8: not measured (its mass is negligible)
    assert tol.error(tail, want) < 1e-5
    top = want.clone()
    top[1] = 4.5
    # the raised token gains 0.5 minus the normaliser's growth (~0.14 here)
    assert 0.3 < tol.error(top, want) < 0.5


def test_cli_passes_model_and_dtype():
    from core_runner.cli import build_parser

    a = build_parser().parse_args(["conformance", "qwen3", "--model", "/ckpt", "--dtype", "bfloat16"])
    assert a.model == "/ckpt" and a.dtype == "bfloat16"
