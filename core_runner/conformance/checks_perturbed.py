"""CR-EQ-12 (perturbed config fields) and CR-EQ-13 (long positions): equivalence with the
reference on configs the registered examples do not cover. Variants come from
``variants.py``; each is a tiny model, checked with short prompts."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from core_runner.conformance.harness import CheckFailure, Ctx, Recorder, fail, greedy, run
from core_runner.conformance.variants import LONG_POSITIONS, Variant, long_position_example, perturbations
from core_runner.loader import CheckpointError

PERTURB_LENGTHS = [1, 9, 23]
PERTURB_NEW = 4
NO_EFFECT = 1e-6  # a field whose variant moves no reference logit by more than this is not read
LONG_NEW = 3


def _checkpoint_run(ctx: Ctx) -> None:
    if getattr(ctx.session, "model", None):
        pytest.skip("not run: a checkpoint run (--model) has no example config to derive variants from")


def _variant_ctx(ctx: Ctx, example: Any) -> Ctx:
    ref = ctx.session.scratch_reference(ctx.registration, example)
    return Ctx(session=ctx.session, check=ctx.check, registration=ctx.registration, example=example,
               capability=ctx.capability, metrics=ctx.metrics, reference=ref)


def _names_the_field(err: BaseException, v: Variant, checkpoint: Path) -> bool:
    """A refusal names the field, or quotes a string value ('gelu_pytorch_tanh'); a number
    is not enough (a shape mismatch quotes sizes that may equal it), and neither is a
    checkpoint that does not load (its error names the variant's directory, whose name
    holds the field): the reference wrote it from a config the plugin accepted."""
    if isinstance(err, CheckpointError):
        return False
    text = str(err).replace(str(checkpoint), "<checkpoint>")
    return v.field.rsplit(".", 1)[-1] in text or (isinstance(v.value, str) and repr(v.value) in text)


def _check_variant(ctx: Ctx, v: Variant, probe: list[int]) -> tuple[str, str]:
    """(outcome, detail): passed | failed | refused by the plugin | not applicable."""
    if v.example is None:
        return "not applicable", v.reason or ""
    try:
        vctx = _variant_ctx(ctx, v.example)
        base, moved = ctx.ref.logits(probe), vctx.ref.logits(probe)
    except Exception as err:  # noqa: BLE001 - the reference's validation (or its forward) rejects the value
        return "not applicable", f"the reference rejects it: {type(err).__name__}: {str(err)[:300]}"
    if base.shape == moved.shape and float((base - moved).abs().max()) <= NO_EFFECT:
        return "not applicable", "the reference's logits do not depend on it"
    try:
        e = vctx.engine()
    except Exception as err:  # noqa: BLE001 - any construction error is reported with its text
        msg = f"{type(err).__name__}: {str(err)[:300]}"
        if _names_the_field(err, v, vctx.ref.path):
            return "refused by the plugin", msg
        return "failed", f"the engine could not load it ({msg})"
    prompts = vctx.ref.prompts(PERTURB_LENGTHS, seed=17)
    try:
        rec = Recorder(e)
        outs = run(e, [(f"v{i}", p, greedy(PERTURB_NEW)) for i, p in enumerate(prompts)])
        vctx.expect_logits_match_reference(rec, outs)
        for i, p in enumerate(prompts):
            vctx.expect_greedy(p, outs[f"v{i}"].token_ids, f"v{i} (prompt of {len(p)})", PERTURB_NEW)
    except CheckFailure as err:
        return "failed", str(err)
    except Exception as err:  # noqa: BLE001 - a crash on a valid config is a failure of the plugin
        return "failed", f"{type(err).__name__}: {str(err)[:300]}"
    return "passed", f"{len(rec.steps)} steps"


def perturbed_config_fields(ctx: Ctx) -> None:
    _checkpoint_run(ctx)
    variants = perturbations(ctx.registration, ctx.example)
    probe = ctx.ref.prompts([12], seed=19)[0]
    results = []
    for v in variants:
        t0 = time.perf_counter()
        outcome, detail = _check_variant(ctx, v, probe)
        results.append({"field": v.field, "value": v.value, "outcome": outcome, "detail": detail,
                        "duration_s": round(time.perf_counter() - t0, 3)})
        ctx.note(f"{v.label}: {outcome}" + (f" ({detail})" if outcome != "passed" else ""))
    ctx.metrics["variants"] = results
    bad = [r for r in results if r["outcome"] == "failed"]
    if bad:
        fail("; ".join(f"{r['field']}={r['value']!r}: {r['detail']}" for r in bad)
             + f" [{len(bad)} of {len(results)} perturbed fields fail]")
    if not any(r["outcome"] == "passed" for r in results):
        pytest.skip(f"not run: no perturbed field applies ({[(r['field'], r['outcome']) for r in results]})")


def long_positions(ctx: Ctx) -> None:
    _checkpoint_run(ctx)
    example, why = long_position_example(ctx.registration, ctx.example)
    if example is None:
        pytest.skip(f"not run: {why}")
    try:
        vctx = _variant_ctx(ctx, example)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"not run: the reference rejects max_position_embeddings={LONG_POSITIONS}: {err}")
    length = min(vctx.ref.max_position, LONG_POSITIONS)
    prompt = vctx.ref.prompts([length - LONG_NEW], seed=29)[0]
    # chunks keep the engine's prefill small on a CPU and put chunk ends at high positions
    e = vctx.engine(max_model_len=length, max_num_seqs=1, block_size=16,
                    max_num_batched_tokens=1024 if ctx.chunked else None)
    rec = Recorder(e)
    out = run(e, [("long", prompt, greedy(LONG_NEW))])["long"]
    vctx.expect_logits_match_reference(rec, {"long": out})
    # greedy against the one reference forward, teacher-forced on the engine's tokens
    seq = prompt + list(out.token_ids)
    ref = vctx.ref.logits(seq[:-1])
    for k, tok in enumerate(out.token_ids):
        row = ref[len(prompt) - 1 + k]
        want = int(row.argmax())
        if tok != want and float(row[want] - row[tok]) > vctx.tolerance.tie:
            fail(f"output token {k} (position {len(prompt) + k}) is {tok}, the reference's greedy token is {want} "
                 f"(gap {float(row[want] - row[tok]):.3g})")
    ctx.note(f"prompt of {len(prompt)} tokens, positions up to {len(seq) - 2} (max_position_embeddings "
             f"{vctx.ref.max_position}); {sum(len(s.req_ids) for s in rec.steps)} logits rows compared")
