"""The runner's draft-model path (``core_runner/runner/drafter.py``) with a minimal draft
registered as a third party would (``tests/spec_draft_fixture.py``): lossless outputs
with a random draft (low acceptance), near-full acceptance with a draft that copies an
attention-free target, chunked prefill, preemption, prefix caching, the draft's share of
the KV pool and the blocks taken ahead for it."""
from __future__ import annotations

import pytest
import torch
from helpers import TINY, Checkpoint, greedy, random_prompts, run
from spec_draft_fixture import plugins_with_draft, write_copying_pair, write_draft
from test_spec_decode import seeded

from core_runner.config import EngineConfig
from core_runner.engine.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A Qwen3 target with random weights, a random draft for it, and an attention-free
    target with a draft that copies it (``write_copying_pair``)."""
    import transformers

    root = tmp_path_factory.mktemp("spec_draft")
    cfg = {**TINY, "tie_word_embeddings": False}
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).float().eval()
    hf.save_pretrained(str(root / "target"))
    target = Checkpoint("target", str(root / "target"), hf)
    draft = write_draft(root / "draft", cfg)

    flat, copy = write_copying_pair(root, cfg)
    return {"target": target, "draft": draft, "flat": flat, "copy": copy, "pm": plugins_with_draft()}


def engine(setup, model: str, draft: str | None = None, k: int = 3, **kw):
    opts = dict(model=model, dtype="float32", device="cpu", max_model_len=128, max_num_seqs=8, block_size=4,
                num_kv_blocks=260)
    if draft is not None:
        opts["speculative_config"] = {"method": "eagle", "num_speculative_tokens": k, "model": draft}
    opts.update(kw)
    return LLMEngine(EngineConfig(**opts), setup["pm"])


def tokens_of(eng, prompts, params, max_steps: int = 2000) -> dict:
    outs = run(eng, [(str(i), p, params) for i, p in enumerate(prompts)], max_steps)
    return {r: list(o.outputs[0].token_ids) for r, o in outs.items()}


PROMPTS = random_prompts([3, 9, 17, 30, 5], seed=21)


@pytest.mark.parametrize("k", [1, 3])
def test_random_draft_is_lossless_greedy_and_chunked(setup, k):
    path = setup["target"].path
    want = tokens_of(engine(setup, path), PROMPTS, greedy(20))
    eng = engine(setup, path, setup["draft"], k)
    assert tokens_of(eng, PROMPTS, greedy(20)) == want
    assert eng.scheduler.spec_num_draft_tokens > 0
    chunked = engine(setup, path, setup["draft"], k, max_num_batched_tokens=8)
    assert tokens_of(chunked, PROMPTS, greedy(20)) == want


def test_seeded_sampling_is_lossless(setup):
    path = setup["target"].path
    params = [seeded(16, 100 + i, 0.8, 0.9) for i in range(len(PROMPTS))]

    def outs(eng):
        done = run(eng, [(str(i), p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, params))])
        return {r: list(o.outputs[0].token_ids) for r, o in done.items()}

    assert outs(engine(setup, path, setup["draft"], 3)) == outs(engine(setup, path))


def test_copying_draft_is_accepted_and_lossless(setup):
    want = tokens_of(engine(setup, setup["flat"]), PROMPTS, greedy(24))
    eng = engine(setup, setup["flat"], setup["copy"], 3)
    assert tokens_of(eng, PROMPTS, greedy(24)) == want
    s = eng.scheduler
    assert s.spec_num_draft_tokens > 50
    assert s.spec_num_accepted_tokens >= 0.9 * s.spec_num_draft_tokens, (s.spec_num_accepted_tokens,
                                                                        s.spec_num_draft_tokens)


def test_preemption_prefix_caching_and_blocks(setup):
    path = setup["target"].path
    want = tokens_of(engine(setup, setup["flat"]), PROMPTS, greedy(24))
    eng = engine(setup, setup["flat"], setup["copy"], 3, enable_prefix_caching=True)
    total = eng.debug.num_free_blocks
    steps = eng.debug.record_steps()
    for i, p in enumerate(PROMPTS):
        eng.add_request(p, greedy(24), req_id=str(i))
    done: dict = {}
    while not any(s.num_scheduled.get("3", 0) > 1 for s in steps):
        for o in eng.step():
            done[o.request_id] = o
    eng.debug.preempt("3")
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert {r: list(o.outputs[0].token_ids) for r, o in done.items()} == want
    assert eng.debug.num_free_blocks == total  # the lookahead blocks came back too
    # a repeat hits the cache, minus the last full block (its draft KV read a token after it)
    again = eng.add_request(PROMPTS[3], greedy(4), req_id="again")
    out = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            out[o.request_id] = o
    assert out[again].num_cached_tokens == (len(PROMPTS[3]) - 1) // 4 * 4 - 4
    assert list(out[again].outputs[0].token_ids) == want["3"][:4]
    del path


def test_draft_cache_shares_the_pool(setup):
    path = setup["target"].path
    plain = engine(setup, path).memory_report()["kv_bytes_per_token"]
    with_draft = engine(setup, path, setup["draft"], 2)
    # the draft's one attention layer (2 KV heads of 16) next to the target's two
    assert with_draft.memory_report()["kv_bytes_per_token"] == plain * 3 // 2
    assert any(k.startswith("kv.drafter.") for k in with_draft.debug.paged_caches())


def outputs_of(eng, params) -> dict:
    plist = params if isinstance(params, list) else [params] * len(PROMPTS)
    done = run(eng, [(str(i), p, sp) for i, (p, sp) in enumerate(zip(PROMPTS, plist))])
    return {r: list(o.outputs[0].token_ids) for r, o in done.items()}


@pytest.mark.parametrize("draft", ["copy", "draft", None])
def test_async_scheduling_keeps_outputs(setup, draft):
    """One step in flight while the next is planned from upper bounds: the same tokens as
    the synchronous loop, with the copying draft (most proposals kept), the random one
    (most rejected) and n-gram proposals, under chunked prefill and a small pool."""
    model = setup["flat"] if draft == "copy" else setup["target"].path
    want = tokens_of(engine(setup, model), PROMPTS, greedy(16))
    kw = dict(max_num_batched_tokens=10, num_kv_blocks=40)
    if draft is None:
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    for params in (greedy(16), [seeded(16, 7 + i, 0.8, 0.9) for i in range(len(PROMPTS))]):
        sync_eng = engine(setup, model, setup[draft] if draft else None, 3, **kw)
        async_eng = engine(setup, model, setup[draft] if draft else None, 3, async_scheduling=True, **kw)
        assert async_eng.plan.async_scheduling and not sync_eng.plan.async_scheduling
        got = outputs_of(async_eng, params)
        assert got == outputs_of(sync_eng, params)
        if not isinstance(params, list):
            assert got == want
        assert async_eng.scheduler.spec_num_draft_tokens > 0
        assert async_eng.debug.num_free_blocks == 40
