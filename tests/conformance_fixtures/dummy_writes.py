"""Broken: a dummy run zeroes the ModelState's per-row offsets (CR-STATE-02)."""
from conformance_fixtures import OFFSETS, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, OFFSETS + "QueryPositionsFromState", OFFSETS + "DummyWritesState")
