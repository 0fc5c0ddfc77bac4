"""The version of the plugin contract (``core_runner.sdk`` and ``core_runner.layers``) and
the check of the range a plugin declares against it (policy: docs/plugin_contract.md).

The SDK version is not core-runner's release version: a release that changes nothing a
plugin imports keeps it. A plugin states the SDK range it was written for with
``registry.add(..., sdk_version=">=1.0,<2")``; that range, checked when the plugin registers,
is the authoritative one. Its distribution's ``Requires-Dist: core-runner`` is pip's concern
at install time and is not consulted here."""
from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

# 1.1: Attention options, KV cache groups; 1.2: "not applicable", zero paged caches; 1.3: LogitsProcessor,
# linear layers' quantized=, row-state snapshots and verification rollback (ModelState hooks);
# 1.4: the standard decoder blocks (DecoderAttention, PreNormDecoderLayer, DecoderStack, AuxHiddenStates, CausalLM);
# 1.5.1: cache binds may repeat, a ModelState keeps only the last (documented; CR-STATE-02 checks it)
SDK_VERSION = "1.5.1"


def check_sdk_range(spec: str | None, plugin: str, what: str) -> None:
    """Refuse a registration whose declared ``sdk_version`` range excludes ``SDK_VERSION``
    (ValueError naming the plugin, its range and this SDK) or is not a ``packaging``
    specifier set. None declares nothing and is accepted unchecked."""
    if spec is None:
        return
    try:
        if not isinstance(spec, str) or not spec.strip():  # '' would accept every version
            raise InvalidSpecifier(repr(spec))
        wanted = SpecifierSet(spec)
    except InvalidSpecifier:
        raise ValueError(f"plugin {plugin!r} ({what}): sdk_version={spec!r} is not a version range: expected a "
                         f"packaging specifier set such as '>=1.0,<2' (this core-runner's SDK is {SDK_VERSION})"
                         ) from None
    if not wanted.contains(SDK_VERSION, prereleases=True):
        major = Version(SDK_VERSION).major
        raise ValueError(f"plugin {plugin!r} ({what}) needs core_runner.sdk {spec} but this core-runner provides "
                         f"SDK {SDK_VERSION}: install a release of the plugin written for SDK {major}.x, or a "
                         f"core-runner whose SDK version is in {spec}")
