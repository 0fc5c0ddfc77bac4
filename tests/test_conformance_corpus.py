"""The planted-bug corpus (issue 34 part 7): realistic single bugs in the real plugins'
models and states, five or more per family kind (dense, MoE, MLA, Mamba hybrid, pooling),
each registered as its plugin registers it (tests/conformance_fixtures/corpus.py). For
every bug the suite, run on a few checks, must fail one of them with a message that
names the field or the module at fault; the family's control (the real plugin) passes the
same checks on the same examples (read from its full conformance run).

Every one of these bugs passes CR-EQ-01 on the registered examples: they never move the
field off one value, a buffer stays at its init value, or no chunk boundary falls where
the bug bites. The suite catches them by field sensitivity (CR-EQ-12), reference weights
that leave no tensor at its init value, the first-diverging-module diagnosis, the
chunked pooling checks and the suite's own fp8 checkpoints (CR-EQ-18: the fp8 loading bugs)."""
from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass

import pytest
from conformance_fixtures.corpus import EMBED_CHECKS as EMBED
from conformance_fixtures.corpus import GENERATE_CHECKS as GENERATE

from core_runner.conformance import run_suite
from core_runner.plugins import PluginManager

for _plugin in ("core_runner_qwen3", "core_runner_llama_template", "core_runner_deepseek",
                "core_runner_granite_hybrid", "core_runner_pooling"):
    pytest.importorskip(_plugin, reason="pip install -e plugins/* -e examples/plugin_template (requirements-dev)")

FAILING = ("failed", "error", "xpassed (strict xfail: fails the run)")
BERT = ("CR-EQ-10", "CR-EQ-12")
@dataclass(frozen=True)
class Bug:
    fixture: str  # tests/conformance_fixtures/<fixture>.py registers the broken architecture
    family: str
    checks: tuple[str, ...]  # what the suite runs for it
    culprit: str  # the check expected to catch it once the suite is strong
    evidence: tuple[tuple[str, ...], ...]  # a failing message holds one word of every group

    def named_by(self, message: str | None) -> bool:
        return bool(message) and all(any(w in message for w in group) for group in self.evidence)

    def param(self):
        return pytest.param(self, id=self.fixture)


BUGS = [
    # dense: Qwen3 (tiny-untied) and the Llama template (tiny-llama3-rope)
    Bug("dense_rope_scaling_ignored", "dense", GENERATE, "CR-EQ-12",
        (("rope_type", "rope_scaling", "rope_parameters.factor"),)),
    Bug("dense_qk_norm_eps", "dense", GENERATE, "CR-EQ-12", (("rms_norm_eps",),)),
    Bug("dense_attention_bias_ignored", "dense", GENERATE, "CR-EQ-12", (("attention_bias",),)),
    Bug("dense_llama3_bands", "dense", GENERATE, "CR-EQ-12", (("low_freq_factor", "high_freq_factor"),)),
    Bug("dense_activation_assumed", "dense", GENERATE, "CR-EQ-12", (("hidden_act",),)),
    # dense, fp8 checkpoints: Qwen3 (tiny-untied) quantized by CR-EQ-18
    Bug("quant_scale_transposed", "dense", ("CR-EQ-01", "CR-EQ-18"), "CR-EQ-18", (("fp8-block",), ("o_proj",))),
    Bug("quant_channel_scale_as_tensor", "dense", ("CR-EQ-01", "CR-EQ-18"), "CR-EQ-18",
        (("ct-channel",), ("o_proj",))),
    Bug("quant_built_dense", "dense", ("CR-EQ-18",), "CR-EQ-18", (("no layer keeps fp8",),)),
    # MoE: Qwen3-MoE (tiny-moe)
    Bug("moe_norm_topk_ignored", "moe", GENERATE, "CR-EQ-12", (("norm_topk_prob",),)),
    Bug("moe_sparse_step_off_by_one", "moe", GENERATE, "CR-EQ-12", (("decoder_sparse_step",),)),
    Bug("moe_mlp_only_layers_ignored", "moe", ("CR-EQ-01",), "CR-EQ-01", (("layers.1.mlp", "mlp_only_layers"),)),
    Bug("moe_tie_ignored", "moe", GENERATE, "CR-EQ-12", (("tie_word_embeddings",),)),
    Bug("moe_expert_gate_up_swapped", "moe", ("CR-EQ-01",), "CR-EQ-01", (("layers.0.mlp",),)),
    # MLA: DeepSeek-V3 (tiny), DeepSeek-V2 (deepseek-v2-lite-shape)
    Bug("mla_correction_bias_ignored", "mla", ("CR-EQ-01",), "CR-EQ-01",
        (("e_score_correction_bias", "layers.1.mlp"),)),
    Bug("mla_correction_bias_in_weights", "mla", ("CR-EQ-01",), "CR-EQ-01",
        (("e_score_correction_bias", "layers.1.mlp"),)),
    Bug("mla_norm_topk_ignored", "mla", GENERATE, "CR-EQ-12", (("norm_topk_prob",),)),
    Bug("mla_shared_experts_assumed", "mla", GENERATE, "CR-EQ-12", (("n_shared_experts",),)),
    Bug("mla_rope_interleave_ignored", "mla", GENERATE, "CR-EQ-12", (("rope_interleave",),)),
    Bug("mla_mscale_swapped", "mla", GENERATE, "CR-EQ-12", (("mscale",),)),
    Bug("mla_scaling_on_shared", "mla", ("CR-EQ-01",), "CR-EQ-01", (("layers.1.mlp",),)),
    # Mamba hybrid: Granite (tiny-dense-nope)
    Bug("hybrid_norm_groups_ignored", "hybrid", GENERATE, "CR-EQ-12", (("mamba_n_groups",),)),
    Bug("hybrid_time_step_limit_ignored", "hybrid", GENERATE, "CR-EQ-12", (("time_step_limit",),)),
    Bug("hybrid_conv_bias_flag", "hybrid", ("CR-EQ-01",), "CR-EQ-01", (("conv1d.bias", "mamba_conv_bias"),)),
    Bug("hybrid_layout_hardcoded", "hybrid", GENERATE, "CR-EQ-12", (("layer_types",),)),
    Bug("hybrid_conv_width_hardcoded", "hybrid", GENERATE, "CR-EQ-12", (("mamba_d_conv",),)),
    # pooling: Qwen3 embedding (tiny-qwen3-embed), BERT (tiny-bert)
    Bug("pooling_mean_last_chunk", "pooling", EMBED, "CR-EQ-11", (("mean",), ("chunk",))),
    Bug("pooling_cls_last_chunk", "pooling", EMBED, "CR-EQ-11", (("cls",), ("chunk",))),
    Bug("pooling_stale_accumulator", "pooling", EMBED, "CR-EQ-11", (("mean",), ("chunk", "row"))),
    Bug("pooling_normalize_stale", "pooling", EMBED, "CR-EQ-10", (("normalize",),)),
    Bug("pooling_bert_eps", "pooling", BERT, "CR-EQ-12", (("layer_norm_eps",),)),
    Bug("pooling_bert_gelu", "pooling", BERT, "CR-EQ-12", (("hidden_act",),)),
]

# the real plugins' controls are read from their full conformance runs (CONTROLS in
# conformance_fixtures/corpus.py, checked in tests/test_conformance_plugins.py); this one is the
# base the chunked pooling bugs change one method of, so it runs here
BASE_CONTROLS = {"loop_pooling": EMBED}


def run_fixture(name: str, checks: tuple[str, ...]) -> dict:
    pm = PluginManager()
    pm.register_module(name, importlib.import_module(f"conformance_fixtures.{name}"))
    return run_suite(name, pm=pm, checks=list(checks), tier="cpu")


def _outcomes(report: dict) -> list[tuple[str, str, str]]:
    return [(c["name"], c["outcome"], (c["message"] or "")[-300:]) for c in report["checks"]]


def test_corpus_covers_every_family_kind_five_times():
    counts = Counter(b.family for b in BUGS)
    assert set(counts) == {"dense", "moe", "mla", "hybrid", "pooling"} and min(counts.values()) >= 5, counts
    assert len({b.fixture for b in BUGS}) == len(BUGS)
    assert all(b.culprit in b.checks for b in BUGS)


@pytest.mark.parametrize("bug", [b.param() for b in BUGS])
def test_planted_bug_fails_naming_its_field_or_module(bug: Bug):
    report = run_fixture(bug.fixture, bug.checks)
    failing = [c for c in report["checks"] if c["outcome"] in FAILING]
    assert failing, f"{bug.fixture}: no check failed: {_outcomes(report)}"
    named = [c["name"] for c in failing if bug.named_by(c["message"])]
    assert named, f"{bug.fixture}: no failing message names {bug.evidence}: {_outcomes(report)}"


@pytest.mark.parametrize("control", sorted(BASE_CONTROLS))
def test_family_control_passes_the_same_checks(control: str):
    report = run_fixture(control, BASE_CONTROLS[control])
    assert report["exit_code"] == 0, _outcomes(report)
    outcomes = {c["outcome"] for c in report["checks"]}
    assert "passed" in outcomes and all(o == "passed" or o.startswith("not run") for o in outcomes), \
        _outcomes(report)
