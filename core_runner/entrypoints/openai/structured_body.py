"""A request body's constraint: OpenAI's ``response_format``, vLLM's ``structured_outputs`` extra,
and vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``.
At most one of them may be given; ``response_format`` {"type": "text"} means none. A
``structured_outputs`` object holding options only (``disable_any_whitespace``, ...) adds them
to the constraint given by another field (e.g. compact JSON for ``response_format``)."""
from __future__ import annotations

from typing import Any

from core_runner.entrypoints.openai.protocol import APIError
from core_runner.structured_outputs import StructuredOutputsParams
from core_runner.structured_outputs.params import KINDS

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _response_format(rf: Any) -> dict | None:
    if not isinstance(rf, dict) or "type" not in rf:
        raise APIError(f"response_format={rf!r}: expected an object with a type: text, json_object or json_schema",
                       "response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise APIError("response_format.json_schema must be an object with a name and a schema object",
                           "response_format")
        # strict or not, the output follows the schema: the grammar cannot leave it
        return {"json": js.get("schema", {})}
    raise APIError(f"response_format.type={kind!r} is not supported: expected text, json_object or json_schema",
                   "response_format")


def structured_outputs_of(body: dict) -> StructuredOutputsParams | None:
    """The constraint of ``body``, or None; more than one source or a bad one is a 400 naming it."""
    found: list[tuple[str, dict]] = []
    options: dict = {}
    if body.get("response_format") is not None:
        spec = _response_format(body["response_format"])
        if spec is not None:
            found.append(("response_format", spec))
    if body.get("structured_outputs") is not None:
        if not isinstance(body["structured_outputs"], dict):
            raise APIError("structured_outputs must be an object (vLLM's StructuredOutputsParams fields)",
                           "structured_outputs")
        so = dict(body["structured_outputs"])
        options = {} if any(so.get(k) is not None for k in KINDS) else so
        if not options:
            found.append(("structured_outputs", so))
    for name, kind in _GUIDED.items():
        if body.get(name) is not None:
            found.append((name, {kind: body[name]}))
    if not found:
        return None
    if len(found) > 1:
        raise APIError(f"{' and '.join(n for n, _ in found)} are both given: give one constraint", found[1][0])
    name, spec = found[0]
    spec.update(options)
    if body.get("guided_whitespace_pattern") is not None:
        spec["whitespace_pattern"] = body["guided_whitespace_pattern"]
    try:
        return StructuredOutputsParams.from_value(spec, name)
    except ValueError as e:
        raise APIError(str(e), name) from None
