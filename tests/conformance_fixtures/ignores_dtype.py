"""Broken: the model builds itself in float32 whatever EngineConfig.dtype says: an option
silently ignored (CR-BOUND-04)."""
from conformance_fixtures import DEFAULT_STATE, OFFSETS, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, OFFSETS + "Float32Only", DEFAULT_STATE)
