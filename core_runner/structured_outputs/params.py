"""StructuredOutputsParams: which constraint a request's output must follow (vLLM's fields)."""
from __future__ import annotations

import json as _json
from dataclasses import dataclass, fields

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass(slots=True)
class StructuredOutputsParams:
    """Exactly one of ``json`` (a JSON schema: dict or JSON string), ``regex``, ``choice``
    (list of strings: the output is one of them), ``grammar`` (EBNF in xgrammar's / GBNF
    syntax) or ``json_object=True`` (any JSON object) is set.

    Options as vLLM's: ``disable_any_whitespace`` makes JSON compact (no free whitespace
    between tokens); ``disable_additional_properties`` is what xgrammar's strict mode does
    already (objects admit only their listed properties unless the schema says
    ``additionalProperties``); ``disable_fallback`` is accepted: there is one backend, so
    nothing falls back. ``whitespace_pattern`` and ``structural_tag`` are refused by name
    (xgrammar has no whitespace pattern; structural tags are not wired here).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.json_object is False:  # vLLM's servers send json_object=False for "not set"
            self.json_object = None
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            what = "none is" if not given else f"{', '.join(given)} are"
            raise ValueError(f"StructuredOutputsParams: exactly one of {', '.join(KINDS[:5])} must be set, {what} set")
        kind = given[0]
        if kind == "structural_tag":
            raise ValueError("StructuredOutputsParams.structural_tag is not supported: use json, regex, choice, "
                             "grammar or json_object")
        if self.whitespace_pattern is not None:
            raise ValueError(f"StructuredOutputsParams.whitespace_pattern={self.whitespace_pattern!r} is not "
                             "supported (xgrammar has no whitespace pattern): use disable_any_whitespace=True for "
                             "compact JSON")
        for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"StructuredOutputsParams.{name}={getattr(self, name)!r}: expected True or False")
        self._check_value(kind)

    def _check_value(self, kind: str) -> None:
        v = getattr(self, kind)
        if kind == "json":
            if isinstance(v, str):
                try:
                    parsed = _json.loads(v)
                except ValueError as e:
                    raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {e}") from None
            else:
                parsed = v
            if not isinstance(parsed, (dict, bool)):
                raise ValueError(f"StructuredOutputsParams.json={v!r}: expected a JSON schema (a dict, or a JSON "
                                 "string of one)")
        elif kind in ("regex", "grammar"):
            if not isinstance(v, str) or not v:
                raise ValueError(f"StructuredOutputsParams.{kind}={v!r}: expected a non-empty string")
        elif kind == "choice":
            if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)) or not v \
                    or any(not isinstance(c, str) for c in v):
                raise ValueError(f"StructuredOutputsParams.choice={v!r}: expected a non-empty list of strings")
            self.choice = list(v)
        elif v is not True:
            raise ValueError(f"StructuredOutputsParams.json_object={v!r}: expected True (or None)")

    @property
    def kind(self) -> str:
        """The constraint set: one of json, regex, choice, grammar, json_object."""
        return next(k for k in KINDS if getattr(self, k) is not None)

    def spec(self) -> str:
        """The constraint as a canonical string (cache key with kind and options)."""
        v = getattr(self, self.kind)
        if self.kind == "json":
            v = _json.loads(v) if isinstance(v, str) else v
            return _json.dumps(v, sort_keys=True, separators=(",", ":"))
        if self.kind == "choice":
            return _json.dumps(v)
        return str(v)

    def cache_key(self) -> tuple:
        return (self.kind, self.spec(), self.disable_any_whitespace)

    @classmethod
    def from_value(cls, value: object, where: str = "structured_outputs") -> StructuredOutputsParams:
        """A StructuredOutputsParams as given, or built from a dict of its fields (JSON bodies)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {unknown}; valid: {sorted(known)}")
            return cls(**value)
        raise ValueError(f"{where}={value!r}: expected a StructuredOutputsParams or a dict of its fields")
