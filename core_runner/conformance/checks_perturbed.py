"""CR-EQ-12 (field sensitivity) and CR-EQ-13 (long positions): equivalence with the
reference on configs the registered examples do not cover. Candidate values come from
``variants.py``; each variant is a tiny model that shares its base example's weights
wherever the shapes agree, so a changed reference is the field's doing.

For each field: the first candidates the reference accepts are built until one changes
the reference's logits on the probe (a PROBE_LEN-token prompt, longer than a perturbed
window). That one must be honoured by the plugin (logits within the tolerance at every
recorded position of a batch of prompts under chunked prefill, and the reference's greedy
tokens) or refused by name when the engine is built. A plugin whose logits still equal the
unperturbed reference's is reported as ignoring the field."""
from __future__ import annotations

import time
from typing import Any

import pytest

from core_runner.conformance.harness import CheckFailure, Ctx, Recorder, fail, greedy, run
from core_runner.conformance.variants import (
    MAX_TRIES,
    PROBE_LEN,
    FieldCandidates,
    Variant,
    dormant_groups,
    field_candidates,
    long_position_example,
    variant,
)
from core_runner.loader import CheckpointError

PERTURB_LENGTHS = [1, 9, 23]
PERTURB_NEW = 4
PERTURB_BUDGET = 16  # tokens a step under chunked prefill: chunk ends fall inside the probe
NO_EFFECT = 1e-6  # a variant that moves no reference logit by more than this is not read
LONG_NEW = 3


def _checkpoint_run(ctx: Ctx) -> None:
    if getattr(ctx.session, "model", None):
        pytest.skip("not run: a checkpoint run (--model) has no example config to derive variants from")


def _variant_ctx(ctx: Ctx, example: Any) -> Ctx:
    ref = ctx.session.scratch_reference(ctx.registration, example, like=ctx.ref)
    return Ctx(session=ctx.session, check=ctx.check, registration=ctx.registration, example=example,
               capability=ctx.capability, metrics=ctx.metrics, reference=ref, kv_groups_hint=ctx.kv_cache_groups())


def names_the_field(err: BaseException, v: Variant, checkpoint: str) -> bool:
    """A refusal names a moved field, or quotes a string value ('gelu_pytorch_tanh'); a number
    is not enough (a shape mismatch quotes sizes that may equal it), and neither is a
    checkpoint that does not load (its error names the variant's directory, whose name
    holds the field): the reference wrote it from a config the plugin accepted."""
    if isinstance(err, CheckpointError):
        return False
    text = str(err).replace(checkpoint, "<checkpoint>")
    return any(n in text for n in v.names) or any(isinstance(x, str) and repr(x) in text for _, x in v.updates)


def _ignored(vctx: Ctx, base: Any, rec: Recorder, outs: dict) -> bool:
    """The plugin's logits equal the unperturbed reference's wherever they were recorded on a prompt."""
    rows = 0
    for req_id, out in outs.items():
        prompt = list(out.prompt_token_ids)
        want = base.logits(prompt)
        for pos, lg in rec.logits_of(req_id):
            if pos < len(prompt):
                if lg.shape != want[pos].shape:
                    return False
                rows += 1
                if vctx.tolerance.error(lg, want[pos]) > vctx.tolerance.limit:
                    return False
    return rows > 0


def _variant_llm(ctx: Ctx, vctx: Ctx, v: Variant) -> tuple[Any, tuple[str, str]]:
    """(the variant's LLM, ("", "")) or (None, (outcome, detail)) when building it raised:
    a refusal that names the field, or a failure."""
    try:
        chunk = PERTURB_BUDGET if ctx.chunked else None
        return vctx.llm(max_model_len=vctx.max_model_len(128), max_num_batched_tokens=chunk), ("", "")
    except Exception as err:  # noqa: BLE001 - any construction error is reported with its text
        msg = f"{type(err).__name__}: {str(err)[:300]}"
        if names_the_field(err, v, str(vctx.ref.path)):
            return None, ("refused by the plugin", msg)
        return None, ("failed", f"the engine could not load it ({msg})")


def _engine_check(ctx: Ctx, vctx: Ctx, v: Variant, probe: list[int]) -> tuple[str, str]:
    llm, refused = _variant_llm(ctx, vctx, v)
    if llm is None:
        return refused
    e = llm.engine
    prompts = [probe] + vctx.ref.prompts(PERTURB_LENGTHS, seed=17)
    try:
        rec = Recorder(e)
        outs = run(e, [(f"v{i}", p, greedy(PERTURB_NEW)) for i, p in enumerate(prompts)])
        try:
            vctx.expect_logits_match_reference(rec, outs)
        except CheckFailure as err:
            if _ignored(vctx, ctx.ref, rec, outs):
                return "failed", (f"{v.label}: the reference's logits change, the plugin's do not: implement it or "
                                  "refuse it by name")
            raise err
        for i, p in enumerate(prompts):
            vctx.expect_greedy(p, outs[f"v{i}"].token_ids, f"v{i} (prompt of {len(p)})", PERTURB_NEW)
    except CheckFailure as err:
        return "failed", str(err)
    except Exception as err:  # noqa: BLE001 - a crash on a valid config is a failure of the plugin
        return "failed", f"{type(err).__name__}: {str(err)[:300]}"
    return "passed", f"{len(rec.steps)} steps"


def _embeds(ctx: Ctx) -> bool:
    return "generate" not in ctx.registration.tasks


def _classifies(ctx: Ctx) -> bool:
    return head_task(ctx) is not None


def head_task(ctx: Ctx) -> str | None:
    """The task whose output is a head's logits (classify, else reward), or None."""
    return next((t for t in ("classify", "reward") if t in ctx.registration.tasks), None)


def _reference_output(ref: Any, probe: list[int], embeds: bool, classifies: bool = False) -> Any:
    """What a variant must change to be read: logits, for an embedding model the final
    hidden states, for a classifier its class logits."""
    if classifies:
        return ref.class_logits(probe)
    return ref.hidden(probe) if embeds else ref.logits(probe)


def _classify_check(ctx: Ctx, vctx: Ctx, v: Variant, probe: list[int]) -> tuple[str, str]:
    """A classifier's variant: raw logits of a batch under chunked prefill equal the
    variant reference's."""
    from core_runner import PoolingParams
    from core_runner.conformance.checks_classify import LOGIT_ATOL

    llm, refused = _variant_llm(ctx, vctx, v)
    if llm is None:
        return refused
    prompts = [probe] + vctx.ref.prompts(PERTURB_LENGTHS, seed=17)
    outs = getattr(llm, head_task(ctx))(prompts, PoolingParams(use_activation=False), use_tqdm=False)
    worst, ignored = 0.0, True
    for p, o in zip(prompts, outs):
        got, want = o.outputs.data.float(), vctx.ref.class_logits(p)
        worst = max(worst, float((got - want).abs().max()) if got.shape == want.shape else float("inf"))
        if max(p) >= ctx.ref.vocab:
            ignored = False
        if ignored:
            before = ctx.ref.class_logits(p)
            ignored = got.shape == before.shape and float((got - before).abs().max()) <= LOGIT_ATOL
    if worst > LOGIT_ATOL:
        if ignored:
            return "failed", (f"{v.label}: the reference's logits change, the plugin's do not: implement it "
                              "or refuse it by name")
        return "failed", f"class logits differ from the reference by {worst:.3g} > {LOGIT_ATOL:g}"
    return "passed", f"{len(prompts)} prompts' class logits"


def _embed_check(ctx: Ctx, vctx: Ctx, v: Variant, probe: list[int]) -> tuple[str, str]:
    """An embedding model's variant: every pooling type it accepts, on a batch under chunked
    prefill, equals the variant reference's pooled hidden states."""
    from core_runner import PoolingParams
    from core_runner.conformance.checks_pooling import EMBED_ATOL, pool_hidden
    from core_runner.pooling_params import POOLING_TYPES

    llm, refused = _variant_llm(ctx, vctx, v)
    if llm is None:
        return refused
    prompts = [probe] + vctx.ref.prompts(PERTURB_LENGTHS, seed=17)
    compared = []
    for kind in POOLING_TYPES:
        try:
            outs = llm.embed(prompts, PoolingParams(pooling_type=kind, normalize=False), use_tqdm=False)
        except ValueError:
            continue  # a pooling type the model does not accept (CR-EQ-10 checks the refusal)
        worst, ignored = 0.0, True
        for p, o in zip(prompts, outs):
            got = o.outputs.data.float()
            want = pool_hidden(vctx.ref.hidden(p), kind)
            worst = max(worst, float((got - want).abs().max()) if got.shape == want.shape else float("inf"))
            if max(p) >= ctx.ref.vocab:  # the unperturbed model cannot read this prompt
                ignored = False
            if ignored:
                before = pool_hidden(ctx.ref.hidden(p), kind)
                ignored = got.shape == before.shape and float((got - before).abs().max()) <= EMBED_ATOL
        if worst > EMBED_ATOL:
            if ignored:
                return "failed", (f"{v.label}: the reference's embeddings change, the plugin's do not: implement it "
                                  "or refuse it by name")
            return "failed", f"pooling {kind}: embeddings differ from the reference by {worst:.3g} > {EMBED_ATOL:g}"
        compared.append(kind)
    if not compared:
        return "failed", f"every pooling type {list(POOLING_TYPES)} was refused"
    return "passed", f"pooling {compared}"


def _try_field(ctx: Ctx, fc: FieldCandidates, probe: list[int], base_logits: Any) -> dict:
    """Build fc's candidates until one changes the reference; check the plugin on that one."""
    tried: list[str] = []
    built = 0
    for updates in fc.tries:
        if built >= MAX_TRIES:
            break
        v = variant(ctx.registration, ctx.example, updates)
        try:
            vctx = _variant_ctx(ctx, v.example)
            moved = _reference_output(vctx.ref, probe, _embeds(ctx), _classifies(ctx))
        except Exception as err:  # noqa: BLE001 - the reference's validation (or its forward) rejects the value
            tried.append(f"{v.label} rejected by the reference ({type(err).__name__}: {str(err)[:120]})")
            continue
        built += 1
        if moved.shape == base_logits.shape and float((moved - base_logits).abs().max()) <= NO_EFFECT:
            tried.append(f"{v.label} does not change the reference")
            continue
        try:
            check = _classify_check if _classifies(ctx) else _embed_check if _embeds(ctx) else _engine_check
            outcome, detail = check(ctx, vctx, v, probe)
        finally:
            vctx.ref.remove()
        return {"field": fc.field, "value": v.value, "label": v.label, "outcome": outcome, "detail": detail}
    return {"field": fc.field, "value": None, "label": fc.field, "outcome": "not applicable",
            "detail": "; ".join(tried) or "no candidate value", "dormant": built > 0}


def perturbed_config_fields(ctx: Ctx) -> None:
    _checkpoint_run(ctx)
    probe = ctx.ref.prompts([min(PROBE_LEN, ctx.max_model_len(PROBE_LEN) - PERTURB_NEW)], seed=19)[0]
    base_logits = _reference_output(ctx.ref, probe, _embeds(ctx), _classifies(ctx))
    fields = field_candidates(ctx.registration, ctx.example)
    results, dormant = [], []
    for fc in fields:
        t0 = time.perf_counter()
        r = _try_field(ctx, fc, probe, base_logits)
        if r.pop("dormant", False):
            dormant.append(fc)
        r["duration_s"] = round(time.perf_counter() - t0, 3)
        results.append(r)
    for fc in dormant_groups(dormant):
        t0 = time.perf_counter()
        r = _try_field(ctx, fc, probe, base_logits)
        r.pop("dormant", None)
        r["duration_s"] = round(time.perf_counter() - t0, 3)
        results.append(r)
    for r in results:
        ctx.note(f"{r['label']}: {r['outcome']}" + (f" ({r['detail']})" if r["outcome"] != "passed" else ""))
    ctx.metrics["variants"] = results
    bad = [r for r in results if r["outcome"] == "failed"]
    if bad:
        fail("; ".join(f"{r['label']}: {r['detail']}" for r in bad)
             + f" [{len(bad)} of {len(results)} perturbed fields fail]")
    if not any(r["outcome"] == "passed" for r in results):
        pytest.skip(f"not run: no perturbed field applies ({[(r['field'], r['outcome']) for r in results]})")


def long_positions(ctx: Ctx) -> None:
    _checkpoint_run(ctx)
    example, length, why = long_position_example(ctx.registration, ctx.example)
    if example is None:
        pytest.skip(f"not run: {why}")
    try:
        vctx = _variant_ctx(ctx, example)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"not run: the reference rejects max_position_embeddings={length}: {err}")
    length = min(vctx.ref.max_position or length, length)
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
    ctx.note(f"prompt of {len(prompt)} tokens, positions up to {len(seq) - 2} ({why}; max_position_embeddings "
             f"{vctx.ref.max_position}); {sum(len(s.req_ids) for s in rec.steps)} logits rows compared")
    vctx.ref.remove()
