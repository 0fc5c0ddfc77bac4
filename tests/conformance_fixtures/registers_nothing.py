"""Broken-plugin fixture `registers_nothing`: a hook that adds no architecture (an error,
never a skip: CR-REG-01)."""
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    return None
