"""CR-SPEC-03: the family's own draft model (DeepSeek's MTP layers: a draft registered for
the target architecture itself) changes no output.

The example checkpoint holds no draft weights (the reference model has none), so both
engines read only its config.json (with ``num_nextn_predict_layers`` raised to 1 where
it is 0) and take the same seeded random weights (``load_format="dummy"``); the draft
gets its own. The workload, chunked prefill and the preemption are CR-SPEC-01's; the
reference model is not compared (its weights are not the dummy ones). A random draft's
proposals are mostly rejected: the check asserts that proposals were made and verified,
and that every token and logits row equals decoding without them.
"""
from __future__ import annotations

import json

import pytest

from core_runner.conformance.checks_spec import (
    CHUNK_BUDGET,
    Sampled,
    _run_preempting,
    _same_request,
    _workload,
)
from core_runner.conformance.harness import Ctx, Recorder, fail, run

OWN_METHODS = ("mtp",)  # drafts that live in the target's own checkpoint
K = 2


def own_draft_equals_plain_decoding(ctx: Ctx) -> None:
    arch = ctx.registration.architecture
    methods = [m for m in OWN_METHODS if ctx.pm.registry.find_draft(arch, m) is not None]
    if not methods:
        pytest.skip(f"not applicable: {arch} registers no draft model of its own ({', '.join(OWN_METHODS)})")
    path = _config_only(ctx)
    budgets: list[int | None] = [None] + ([CHUNK_BUDGET] if ctx.chunked else [])
    for method in methods:
        spec = {"method": method, "num_speculative_tokens": K}
        for budget in budgets:
            where = f"{method}, " + ("default budget" if budget is None else f"max_num_batched_tokens={budget}")
            opts = dict(model=path, load_format="dummy", seed=0, max_num_seqs=8, max_num_batched_tokens=budget)
            base = ctx.engine(**opts)
            base_rec = Recorder(base)
            want = run(base, _workload(ctx))
            s: Sampled = _run_preempting(ctx, where, chunked=budget is not None, spec=spec, **opts)
            for rid, prompt, _ in _workload(ctx):
                _same_request(ctx, where, rid, prompt, s, base_rec, want[rid], reference=False)
            sch = s.engine.scheduler
            if sch.spec_num_draft_tokens <= 0 or sch.spec_num_drafts <= 0:
                fail(f"{where}: the draft proposed {sch.spec_num_draft_tokens} tokens in {sch.spec_num_drafts} "
                     "verifications; the workload needs some")
            ctx.note(f"{where}: {sch.spec_num_accepted_tokens} of {sch.spec_num_draft_tokens} proposals accepted "
                     "(random draft weights)")


def _config_only(ctx: Ctx) -> str:
    """A directory holding the example's config.json with at least one draft layer."""
    src = ctx.ref.path / "config.json"
    dst = ctx.ref.path.parent / f"{ctx.ref.path.name}-own-draft"
    dst.mkdir(exist_ok=True)
    cfg = json.loads(src.read_text())
    cfg["num_nextn_predict_layers"] = max(1, int(cfg.get("num_nextn_predict_layers") or 0))
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return str(dst)
