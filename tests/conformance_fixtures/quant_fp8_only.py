"""Correct: the Qwen3 plugin's model declaring quantization:fp8 only (compressed-tensors
undeclared), so CR-EQ-18 checks that a compressed-tensors checkpoint is refused by name."""
from conformance_fixtures.corpus import QWEN3, as_registered
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    kw = as_registered("Qwen3ForCausalLM")
    kw["capabilities"] = {k: v for k, v in kw["capabilities"].items() if k != "quantization:compressed-tensors"}
    kw["examples"] = [ex for ex in kw["examples"] if ex["name"] in QWEN3]
    registry.add(architecture="Qwen3ForCausalLM", override=True, **kw)
