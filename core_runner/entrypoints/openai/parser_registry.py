"""Looking up an output parser by its ``--`` option's value: the built-in classes first,
then the entry points of the parser kind's group (so a package adds one without a code
change here); an unknown name is refused listing every valid one."""
from __future__ import annotations

from importlib.metadata import entry_points


def find_parser(name: str, built_in: dict[str, type], group: str, option: str) -> type:
    """The class registered as ``name`` in ``built_in`` or as an entry point of ``group``;
    ValueError naming ``option``, the value and the valid names otherwise."""
    if name in built_in:
        return built_in[name]
    found = entry_points(group=group)
    for ep in found:
        if ep.name == name:
            return ep.load()
    valid = sorted(built_in) + sorted(ep.name for ep in found)
    raise ValueError(f"{option} {name!r} is unknown; valid: {', '.join(valid)}")
