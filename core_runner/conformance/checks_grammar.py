"""CR-SO-01: structured outputs on the family's random-weight engine. Greedy requests
constrained by a JSON schema, a regex, a choice and ``json_object`` (the suite's tokenizer,
``conformance/tokenizer.py``, gives xgrammar a vocabulary of known strings) must give
outputs that parse and validate; requests without a grammar in the same batch must get the
tokens they get alone, and so must the constrained ones (the mask touches only its rows).

The grammars are bounded (an enum, a boolean, an integer of at most two digits; a regex of
bounded repeats; three choices), so a request that runs out of ``max_tokens`` before its
grammar terminates is a failure. ``json_object`` is not bounded: a random model may write a
string that never closes, so a ``json_object`` output cut by ``max_tokens`` is only checked
to be a prefix xgrammar's matcher accepts (noted), and a terminated one must parse.
"""
from __future__ import annotations

import json
import re
from typing import Any

from core_runner.conformance.checks_score import tokenizer_or_skip
from core_runner.conformance.harness import Ctx, fail

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "n"],
          "properties": {"name": {"type": "string", "enum": ["ab", "cd"]}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
REGEX = r"[a-c]{2,4}-[0-9]{1,3}"
CHOICES = ["alpha", "beta", "gamma"]
MAX_TOKENS = 40
PLAIN_TOKENS = 12
KINDS = ("json", "regex", "choice", "json_object")


def _constraint(kind: str) -> Any:
    from core_runner.structured_outputs import StructuredOutputsParams

    spec: dict[str, Any] = {"json": {"json": SCHEMA}, "regex": {"regex": REGEX}, "choice": {"choice": CHOICES},
                            "json_object": {"json_object": True}}[kind]
    return StructuredOutputsParams(**spec, disable_any_whitespace=kind in ("json", "json_object"))


def _params(kind: str | None) -> Any:
    from core_runner import SamplingParams
    from core_runner.sampling_params import AtMost

    if kind is None:
        return SamplingParams(max_tokens=AtMost(PLAIN_TOKENS), temperature=0.0, ignore_eos=True)
    return SamplingParams(max_tokens=AtMost(MAX_TOKENS), temperature=0.0, structured_outputs=_constraint(kind))


def _schema_errors(value: Any) -> list[str]:
    """What breaks SCHEMA in ``value`` (a small validator: the schema is the suite's own)."""
    if not isinstance(value, dict):
        return [f"not an object: {value!r}"]
    errs = [f"unexpected key {k!r}" for k in value if k not in SCHEMA["properties"]]
    errs += [f"missing key {k!r}" for k in SCHEMA["required"] if k not in value]
    if "name" in value and value["name"] not in SCHEMA["properties"]["name"]["enum"]:
        errs.append(f"name {value['name']!r} not in the enum")
    if "ok" in value and not isinstance(value["ok"], bool):
        errs.append(f"ok {value['ok']!r} is not a boolean")
    n = value.get("n")
    if "n" in value and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 99):
        errs.append(f"n {n!r} is not an integer in [0, 99]")
    return errs


def _validate(ctx: Ctx, kind: str, out: Any, tok: Any, where: str) -> str:
    """Fails unless the output satisfies its grammar; returns how it finished."""
    ids = list(out.token_ids)
    text = tok.decode(ids, skip_special_tokens=True)
    what = f"{where}: {kind} output {text!r} (tokens {ids}, finish_reason {out.finish_reason!r})"
    if out.finish_reason == "length":
        if kind != "json_object":
            fail(f"{what}: cut by max_tokens={MAX_TOKENS} before its bounded grammar ended")
        _accepted_prefix(ctx, ids, what)
        return "cut"
    if out.finish_reason != "stop":
        fail(f"{what}: expected 'stop' once the grammar terminates")
    if kind == "regex":
        if re.fullmatch(REGEX, text) is None:
            fail(f"{what}: does not match {REGEX!r}")
    elif kind == "choice":
        if text not in CHOICES:
            fail(f"{what}: not one of {CHOICES}")
    else:
        try:
            value = json.loads(text)
        except ValueError as e:
            fail(f"{what}: does not parse as JSON ({e})")
        errs = _schema_errors(value) if kind == "json" else ([] if isinstance(value, dict) else ["not an object"])
        if errs:
            fail(f"{what}: does not validate: {'; '.join(errs)}")
    return "complete"


def _accepted_prefix(ctx: Ctx, ids: list[int], what: str) -> None:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(ctx.ref.tokenizer(), vocab_size=ctx.ref.vocab, stop_token_ids=[0])
    compiled = xgr.GrammarCompiler(info).compile_json_schema('{"type": "object"}', any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    for k, t in enumerate(ids):
        if not matcher.accept_token(int(t)):
            fail(f"{what}: token {k} ({t}) leaves the grammar")


def grammars_hold(ctx: Ctx) -> None:
    tok = tokenizer_or_skip(ctx)
    llm = ctx.llm(max_num_seqs=8)
    prompts = ctx.ref.prompts([5, 11, 3, 8, 14, 6], seed=501)
    kinds: list[str | None] = [None, "json", "regex", None, "choice", "json_object"]
    alone = {}
    for i, (p, k) in enumerate(zip(prompts, kinds)):
        alone[i] = llm.generate([{"prompt_token_ids": p}], _params(k), use_tqdm=False)[0].outputs[0]
    mixed = llm.generate([{"prompt_token_ids": p} for p in prompts], [_params(k) for k in kinds], use_tqdm=False)
    finished = {}
    for i, (k, o) in enumerate(zip(kinds, mixed)):
        got, want = list(o.outputs[0].token_ids), list(alone[i].token_ids)
        label = "no grammar" if k is None else k
        if o.outputs[0].finish_reason == "error":
            fail(f"request {i} ({label}) finished with finish_reason 'error' in the mixed batch")
        if got != want:
            ctx.expect_tokens(got, want, f"request {i} ({label}) in a batch with grammar rows vs alone")
        if k is not None:
            finished[k] = _validate(ctx, k, o.outputs[0], tok, f"request {i} in the mixed batch")
            _validate(ctx, k, alone[i], tok, f"request {i} alone")
    texts = {k: tok.decode(list(o.outputs[0].token_ids), skip_special_tokens=True)
             for k, o in zip(kinds, mixed) if k is not None}
    ctx.note(f"{len(prompts)} greedy requests in one batch, {kinds.count(None)} without a grammar (tokens as "
             f"alone); outputs {texts}; " + ", ".join(f"{k} {v}" for k, v in finished.items()))
