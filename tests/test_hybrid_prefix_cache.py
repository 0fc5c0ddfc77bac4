"""Prefix caching for models with row state (issue 37 part 3, docs/hybrid_prefix_caching.md):
the Granite hybrid with row-state snapshots gives the same tokens and logits with the cache
as without it, when a hit's request is preempted and resumes, and when the step budget is
smaller than the snapshot interval; a shared-prefix workload's hit rate is measured. The
scheduler aligns prefill chunks to snapshot boundaries and publishes a snapshot only once
its step is back."""
from __future__ import annotations

import pytest
import torch
from helpers import Recorder, drain, greedy, random_prompts
from test_granite_hybrid import _build

from core_runner.engine.request import Request
from core_runner.engine.scheduler import Scheduler
from core_runner.runner.output import ModelRunnerOutput

pytest.importorskip("core_runner_granite_hybrid", reason="pip install -e plugins/granite_hybrid (requirements-dev)")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, single_torch_thread):
    return _build(tmp_path_factory.mktemp("granite_prefix"), "dense_nope")


def _engine(ckpt, caching: bool, **kw):
    from core_runner import LLM

    opts = dict(mamba_block_size=8, mamba_cache_slots=32) if caching else {}
    return LLM(ckpt.path, dtype="float32", max_model_len=96, max_num_seqs=4, block_size=4, num_kv_blocks=96,
               enable_prefix_caching=caching, strict=True, **opts, **kw).engine


def _run(e, prompts: dict, preempt: str | None = None) -> tuple[dict, Recorder]:
    rec, outs = Recorder(e), {}
    for rid, p in prompts.items():
        e.add_request(p, greedy(6), req_id=rid)
        if preempt == rid:
            while len(e.scheduler.requests[rid].output_token_ids) < 2:
                for o in e.step():
                    outs[o.request_id] = o
            e.debug.preempt(rid)
        else:
            drain(e, outs)
    drain(e, outs)
    return outs, rec


def _same(on, off, rec_on, rec_off) -> None:
    for rid in off:
        assert on[rid].token_ids == off[rid].token_ids, rid
        theirs = dict(rec_off.logits_of(rid))
        for pos, lg in rec_on.logits_of(rid):
            if pos in theirs:
                assert (lg - theirs[pos]).abs().max().item() <= 1e-5, (rid, pos)


@pytest.mark.parametrize("budget,preempt", [(None, "b"), (4, None)])
def test_cache_on_equals_off(ckpt, budget, preempt):
    """A hit resumes from the snapshot at 16 or 24 tokens; preempted after its hit, b resumes
    from snapshots again; with 4 tokens a step (less than the 8-token interval) every chunk
    ends inside an interval and snapshots still land on its boundaries."""
    shared = random_prompts([19], 5, ckpt.vocab)[0]
    tails = random_prompts([7, 7, 7], 6, ckpt.vocab)
    prompts = {"a": shared + tails[0], "b": shared + tails[0], "c": shared + tails[1][:3]}
    on, rec_on = _run(_engine(ckpt, True, max_num_batched_tokens=budget), prompts, preempt)
    off, rec_off = _run(_engine(ckpt, False, max_num_batched_tokens=budget), prompts, preempt)
    _same(on, off, rec_on, rec_off)
    assert on["b"].num_cached_tokens == 24 and on["c"].num_cached_tokens == 16
    if preempt:
        assert on["b"].num_preemptions == 1


def test_shared_prefix_hit_rate(ckpt):
    """8 requests sharing a 40-token prefix (5 snapshot intervals), each with its own 6-token
    question: every request after the first resumes at 40 tokens."""
    prefix = random_prompts([40], 9, ckpt.vocab)[0]
    questions = random_prompts([6] * 8, 10, ckpt.vocab)
    e = _engine(ckpt, True)
    _run(e, {f"q{i}": prefix + q for i, q in enumerate(questions)})
    rate = e.scheduler.prefix_cache_hits / e.scheduler.prefix_cache_queries
    print(f"granite hybrid shared-prefix hit rate: {rate:.3f} "
          f"({e.scheduler.prefix_cache_hits} of {e.scheduler.prefix_cache_queries} tokens)")
    assert e.scheduler.prefix_cache_hits == 7 * 40
    assert rate == pytest.approx(7 * 40 / (8 * 46))


def test_scheduler_aligns_chunks_and_publishes_after_the_step():
    s = Scheduler(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, block_size=4, num_blocks=0,
                  enable_prefix_caching=True, kv_cache_windows=[], mamba_block_size=8, mamba_cache_slots=4)
    a = Request("a", list(range(3, 23)), greedy(1), seed=0)
    s.add_request(a)
    chunks = []
    while not a.output_token_ids:
        out = s.schedule()
        chunks.append((out.num_scheduled_tokens["a"], dict(out.state_snapshots)))
        assert len(s.kv.states.cached) == len(chunks) - 1  # findable only once its step is back
        s.update_from_output(out, ModelRunnerOutput(["a"], [7] if "a" in out.sample_req_ids else []))
    assert [n for n, _ in chunks] == [8, 8, 4]  # 20 tokens: ends at 8 and 16, then the rest
    assert [bool(snap) for _, snap in chunks] == [True, True, False]
    assert len(s.kv.states.cached) == 2
    # an attention-free hit is snapshot-only: no block, 16 tokens computed
    s.add_request(Request("b", list(range(3, 23)), greedy(1), seed=0))
    out = s.schedule()
    new = out.new_reqs[0]
    assert new.num_computed_tokens == 16 and new.state_slot >= 0 and new.block_ids == []
    with pytest.raises(ValueError, match="mamba_block_size=6"):
        Scheduler(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=8, block_size=4, num_blocks=0,
                  enable_prefix_caching=True, kv_cache_windows=[], mamba_block_size=6, mamba_cache_slots=1)


def test_options_refused_where_unused(ckpt):
    from core_runner import LLM
    from core_runner.config import EngineConfig

    with pytest.raises(ValueError, match="mamba_block_size=6"):
        EngineConfig(model="x", device="cpu", block_size=4, mamba_block_size=6)
    with pytest.raises(ValueError, match="mamba_cache_slots=8: prefix caching is off"):
        LLM(ckpt.path, dtype="float32", max_model_len=32, max_num_seqs=2, num_kv_blocks=32,
            enable_prefix_caching=False, mamba_cache_slots=8)
    e = _engine(ckpt, True)
    rep = e.memory_report()
    assert rep["state_snapshot_slots"] == 32 and rep["state_snapshot_bytes"] == 32 * rep["state_bytes_per_row"]
    assert torch.tensor(rep["state_snapshot_bytes"]) > 0
