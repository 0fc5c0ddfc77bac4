"""Control: per-row state kept correctly (offsets.RowOffsetState). Passes what the broken variants fail."""
from conformance_fixtures import OFFSETS, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, OFFSETS + "QueryPositionsFromState", OFFSETS + "RowOffsetState")
