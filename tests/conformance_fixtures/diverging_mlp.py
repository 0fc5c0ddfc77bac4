"""Broken: layer 1's MLP output is scaled (CR-EQ-01 fails; its diagnosis names
model.layers.1.mlp and says layer 0 and layer 1's attention match)."""
from conformance_fixtures import QWEN3_BUGS, register_qwen3
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_qwen3(registry, QWEN3_BUGS + "LayerOneMLPScaled")
