"""Broken: the ModelState's per-row offset is not reset in add_request, so a reused row
behaves unlike a fresh one (CR-STATE-01)."""
from conformance_fixtures import OFFSETS, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, OFFSETS + "QueryPositionsFromState", OFFSETS + "StaleRowState")
