"""Broken: the Granite hybrid declaring prefix_caching supported. Its ModelState starts a
request's Mamba state from zero even when the prefix cache supplied the first blocks
(the recurrent state at the cached offset is not kept anywhere), so a hit computes the
rest of the prompt from the wrong state: CR-EQ-09 must find the differing output, while
CR-EQ-01 (no hits) passes."""
from conformance_fixtures import register_granite
from core_runner import hookimpl


@hookimpl
def register_models(registry):
    register_granite(registry, prefix_caching="supported")
