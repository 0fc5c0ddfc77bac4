"""Broken: the router of layer 2 (a sparse layer) of the Qwen3-MoE model is biased
(CR-EQ-01 fails; its diagnosis names model.layers.2.mlp.gate)."""
from conformance_fixtures import DEFAULT_STATE, QWEN3_BUGS
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    from core_runner_qwen3.hooks import MOE_CAPABILITIES, TINY_MOE

    registry.add(
        architecture="Qwen3MoeForCausalLM", model=QWEN3_BUGS + "LayerTwoRouterBiased", model_state=DEFAULT_STATE,
        capabilities=MOE_CAPABILITIES, reference="transformers:Qwen3MoeForCausalLM",
        examples=[{"name": "tiny-moe", "config": TINY_MOE}],
    )
