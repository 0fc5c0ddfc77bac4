"""Broken: the stale-row state (its per-row offset is not reset when a request takes the
row) with speculative_decoding declared supported. A request that takes a row after a
speculative one starts from that request's offset: CR-SPEC-02 must find it. (The offset
also advances over rejected proposals, so CR-SPEC-01 fails too.)"""
from conformance_fixtures import OFFSETS, register
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register(registry, OFFSETS + "QueryPositionsFromState", OFFSETS + "StaleRowState",
             speculative_decoding="supported")
