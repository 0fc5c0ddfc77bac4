"""The planted-bug corpus (tests/test_conformance_corpus.py): each corpus fixture module
registers one architecture exactly as its real plugin registers it - capabilities,
reference and examples are read from the plugin's own hook, so when the plugin's
examples improve the fixture sees them - with a broken model or ModelState in place of
the real one. The family's control module registers the real classes the same way.

``examples`` picks the plugin's examples by name (the corpus runs a few cheap ones); a
name the plugin no longer registers is an error, never a silently smaller corpus."""
from __future__ import annotations

import importlib
from typing import Any

# architecture -> the module whose register_models hook registers it
HOOKS = {
    "Qwen3ForCausalLM": "core_runner_qwen3.hooks",
    "Qwen3MoeForCausalLM": "core_runner_qwen3.hooks",
    "LlamaForCausalLM": "core_runner_llama_template.hooks",
    "DeepseekV2ForCausalLM": "core_runner_deepseek.hooks",
    "DeepseekV3ForCausalLM": "core_runner_deepseek.hooks",
    "GraniteMoeHybridForCausalLM": "core_runner_granite_hybrid.hooks",
    "BertModel": "core_runner_pooling.hooks",
    "Qwen3Model": "core_runner_pooling.hooks",
}

DENSE_BUGS = "conformance_fixtures.dense_bugs:"
MOE_BUGS = "conformance_fixtures.moe_bugs:"
MLA_BUGS = "conformance_fixtures.mla_bugs:"
HYBRID_BUGS = "conformance_fixtures.hybrid_bugs:"
POOLING_BUGS = "conformance_fixtures.pooling_bugs:"


class _Capture:
    """Stands in for the registry while a plugin's hook runs: keeps what it adds."""

    def __init__(self) -> None:
        self.added: dict[str, dict[str, Any]] = {}

    def add(self, architecture: str, model: str, model_state: str, **kw: Any) -> None:
        self.added[architecture] = dict(model=model, model_state=model_state, **kw)

    def add_draft(self, *args: Any, **kw: Any) -> None:
        return None


def as_registered(architecture: str) -> dict[str, Any]:
    """The keyword arguments the real plugin passes to ``registry.add`` for ``architecture``."""
    capture = _Capture()
    importlib.import_module(HOOKS[architecture]).register_models(capture)
    return capture.added[architecture]


def register_as_plugin(registry: Any, architecture: str, examples: tuple[str, ...], *, model: str | None = None,
                       model_state: str | None = None) -> None:
    """Register ``architecture`` as its plugin does, with its examples named ``examples``
    and ``model`` / ``model_state`` (lazy "module:attr") in place of the real ones."""
    kw = as_registered(architecture)
    by_name = {ex["name"]: ex for ex in kw["examples"]}
    unknown = [n for n in examples if n not in by_name]
    if unknown:
        raise ValueError(f"{architecture}: the plugin registers no example {unknown} (it has {sorted(by_name)})")
    kw["examples"] = [by_name[n] for n in examples]
    if model is not None:
        kw["model"] = model
    if model_state is not None:
        kw["model_state"] = model_state
    registry.add(architecture=architecture, override=True, **kw)


# the examples each family's bugs (and its control) run on
QWEN3 = ("tiny-untied",)
LLAMA = ("tiny-llama3-rope",)
MOE = ("tiny-moe",)
V2 = ("deepseek-v2-lite-shape",)
V3 = ("tiny",)
GRANITE = ("tiny-dense-nope",)
BERT = ("tiny-bert",)
QWEN3_EMBED = ("tiny-qwen3-embed",)


# the checks each family's bugs run (tests/test_conformance_corpus.py)
GENERATE_CHECKS = ("CR-EQ-01", "CR-EQ-12")
EMBED_CHECKS = ("CR-EQ-10", "CR-EQ-11")

# The family controls: each real plugin, through its entry point, passes on the examples above the
# checks its family's bugs run, so a bug's failure is the bug's. Read from the plugin's full
# conformance run (tests/test_conformance_plugins.py), which runs them.
_POOLING_CHECKS = (*EMBED_CHECKS, "CR-EQ-12")
CONTROLS = {  # plugin -> architecture -> (examples, checks)
    "qwen3": {"Qwen3ForCausalLM": (QWEN3, (*GENERATE_CHECKS, "CR-EQ-18")),
              "Qwen3MoeForCausalLM": (MOE, GENERATE_CHECKS)},
    "llama_template": {"LlamaForCausalLM": (LLAMA, (*GENERATE_CHECKS, "CR-EQ-18"))},
    "deepseek": {"DeepseekV2ForCausalLM": (V2, GENERATE_CHECKS), "DeepseekV3ForCausalLM": (V3, GENERATE_CHECKS)},
    "granite_hybrid": {"GraniteMoeHybridForCausalLM": (GRANITE, GENERATE_CHECKS)},
    "pooling": {"BertModel": (BERT, _POOLING_CHECKS), "Qwen3Model": (QWEN3_EMBED, _POOLING_CHECKS)},
}
