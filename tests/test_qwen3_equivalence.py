"""core-runner's Qwen3 plugin against transformers.Qwen3ForCausalLM (CPU, float32).

References are computed one prompt at a time (batch 1, all-ones attention mask).
Logits are read through ``engine.debug.record_steps()`` (via helpers.Recorder):
every real step records the logits of the last scheduled token of each request.
"""
from __future__ import annotations

import pytest
import torch
from helpers import (
    Recorder,
    assert_logits_match_hf,
    greedy,
    hf_greedy,
    hf_logits,
    make_engine,
    random_prompts,
    run,
)

LOGIT_ATOL = 1e-4


# ---------------------------------------------------------------------------------
# 1. logits
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["one_step_prefill", "chunked_prefill"])
def test_logits_match_hf(ckpt, mode):
    lengths = [1, 7, 16, 33]
    prompts = random_prompts(lengths, seed=5, vocab=ckpt.vocab)
    opts = {"max_num_batched_tokens": 7} if mode == "chunked_prefill" else {}
    engine = make_engine(ckpt, **opts)
    rec = Recorder(engine)
    n_new = 6
    outs = run(engine, [(f"r{i}", p, greedy(n_new)) for i, p in enumerate(prompts)])

    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, n_new), f"r{i} (len {len(p)})"

    if mode == "one_step_prefill":
        # the whole batch of prompts runs in the first step, no chunking
        first = rec.steps[0]
        assert first.num_scheduled == {f"r{i}": n for i, n in enumerate(lengths)}
        assert set(first.num_computed.values()) == {0}
        for i, p in enumerate(prompts):
            ref = hf_logits(ckpt, p)[-1]
            err = (first.logits[f"r{i}"] - ref).abs().max().item()
            assert err <= LOGIT_ATOL, f"prefill logits of r{i} (len {len(p)}) differ from HF by {err:.3g}"
        # then pure decode steps, all four requests together
        decode = rec.steps[1:]
        assert len(decode) == n_new - 1
        for s in decode:
            assert s.num_scheduled == {f"r{i}": 1 for i in range(len(prompts))}
    else:
        assert max(s.num_tokens for s in rec.steps) <= 7
        chunk_ends = [(s, r) for s in rec.steps for r in s.req_ids
                      if 0 < s.num_computed[r] + s.num_scheduled[r] < lengths[int(r[1:])]]
        assert chunk_ends, "max_num_batched_tokens=7 should have split the 16- and 33-token prompts"

    # decode steps (and, when chunked, every chunk end) against HF on the growing sequence
    checked = assert_logits_match_hf(ckpt, rec, outs, atol=LOGIT_ATOL)
    assert checked >= len(prompts) * n_new


def test_decode_logits_match_hf_incremental(untied):
    """The same check written the literal way: HF's last-position logits on the growing
    sequence, one decode step at a time."""
    prompt = random_prompts([9], seed=17)[0]
    engine = make_engine(untied)
    rec = Recorder(engine)
    out = run(engine, [("a", prompt, greedy(8))])["a"]
    seq = list(prompt)
    assert len(rec.steps) == 8
    for k, step in enumerate(rec.steps):
        ids = torch.tensor([seq])
        with torch.no_grad():
            ref = untied.hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1]
        err = (step.logits["a"] - ref).abs().max().item()
        assert err <= LOGIT_ATOL, f"step {k}: logits differ from HF by {err:.3g}"
        assert int(ref.argmax()) == out.token_ids[k]
        seq.append(out.token_ids[k])


# ---------------------------------------------------------------------------------
# 2. greedy tokens under scheduling and cache-layout variations
# ---------------------------------------------------------------------------------
LENGTHS = [1, 40, 2, 7, 13, 21, 29, 33, 36, 17]
N_NEW = 12

SCENARIOS = {
    "one_big_step": dict(max_num_seqs=16),  # default budget: max(max_model_len, 2048)
    "chunked_budget_7": dict(max_num_batched_tokens=7),
    "preempt_small_pool": dict(max_model_len=64, block_size=4, num_kv_blocks=16),
    "preempt_chunked_7": dict(max_model_len=64, block_size=4, num_kv_blocks=18, max_num_batched_tokens=7),
    "block_size_1": dict(block_size=1),
    "block_size_3": dict(block_size=3),
    "block_size_16": dict(block_size=16),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_greedy_matches_hf(ckpt, scenario):
    opts = SCENARIOS[scenario]
    prompts = random_prompts(LENGTHS, seed=11, vocab=ckpt.vocab)
    engine = make_engine(ckpt, **opts)
    rec = Recorder(engine)
    outs = run(engine, [(f"p{i}", p, greedy(N_NEW)) for i, p in enumerate(prompts)])

    mismatches = []
    for i, p in enumerate(prompts):
        o = outs[f"p{i}"]
        assert o.finish_reason == "length" and len(o.token_ids) == N_NEW, (o.req_id, o.finish_reason, o.token_ids)
        ref = hf_greedy(ckpt, p, N_NEW)
        if o.token_ids != ref:
            mismatches.append(f"p{i} (len {len(p)}, {o.num_preemptions} preemptions): {o.token_ids} != HF {ref}")
    assert not mismatches, f"{scenario}: " + "; ".join(mismatches)
    # a meaningful reference: continuations are not one repeated token
    assert sum(len(set(o.token_ids)) >= 4 for o in outs.values()) >= len(prompts) // 2

    # prove the scenario exercised what it is named after
    budget = engine.config.max_num_batched_tokens
    assert all(s.num_tokens <= budget for s in rec.steps)
    # a prompt chunk that continues one scheduled in an earlier step
    chunk_continuations = [(s, r) for s in rec.steps for r in s.req_ids
                           if r not in s.new_req_ids and s.num_computed[r] < len(prompts[int(r[1:])])]
    preempted_outputs = [o for o in outs.values() if o.num_preemptions > 0]
    if scenario == "one_big_step":
        first = rec.steps[0]
        assert first.num_scheduled == {f"p{i}": n for i, n in enumerate(LENGTHS)}
        assert not chunk_continuations
    if "chunked" in scenario:
        assert chunk_continuations, "max_num_batched_tokens=7 never split a prompt"
    else:
        assert not chunk_continuations
    if "preempt" in scenario:
        assert engine.scheduler.num_preemptions > 0
        assert preempted_outputs, "the small KV pool never preempted a request"
        assert sum(o.num_preemptions for o in outs.values()) == engine.scheduler.num_preemptions
        assert any(s.preempted for s in rec.steps)
    else:
        assert engine.scheduler.num_preemptions == 0 and not preempted_outputs
    if scenario.startswith("block_size_"):
        bs = int(scenario.rsplit("_", 1)[1])
        for cache in engine.runner.kv_caches.values():
            assert cache.shape[2] == bs
    # the scheduler returned every block
    assert engine.scheduler.pool.num_free == engine.num_blocks
