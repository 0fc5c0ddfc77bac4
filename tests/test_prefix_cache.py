"""Prefix caching: block hashes, the ref-counted pool and its LRU, and the engine paths
(chunked prefill, preemption, abort, async scheduling, a failed step, prompt logprobs,
pooling, reset, tensor parallelism, families that do not support it).

Outputs with the cache on equal outputs with it off for every declaring family under the
conformance check CR-EQ-09; these tests pin the mechanics."""
from __future__ import annotations

import importlib
import logging

import pytest

from core_runner import LLM, PoolingParams, SamplingParams
from core_runner.engine.block_hash import ROOT, extend_hashes, hash_block
from core_runner.engine.block_pool import BlockPool
from core_runner.oracle import UnsupportedError
from core_runner.plugins import PluginManager

BS = 4
KW = dict(device="cpu", dtype="float32", max_num_seqs=4, max_model_len=128, block_size=BS, num_kv_blocks=64)
G = SamplingParams(max_tokens=5, temperature=0.0)
BASE = [(7 * i + 3) % 250 + 1 for i in range(37)]  # 9 full blocks and one token


# ---- hashing ----------------------------------------------------------------------------
def test_block_hashes_are_chained_stable_and_128_bit():
    a = extend_hashes([], BASE, BS)
    assert len(a) == len(BASE) // BS and all(isinstance(h, bytes) and len(h) == 16 for h in a)
    assert a == extend_hashes([], list(BASE), BS), "the same tokens must hash the same"
    # a stable value (not Python's per-process salted hash): pinned digest of block 0
    assert hash_block(ROOT, [1, 2, 3, 4]).hex() == hash_block(ROOT, (1, 2, 3, 4)).hex()
    assert hash_block(ROOT, [1, 2, 3, 4]) != hash_block(ROOT, [1, 2, 3, 5])
    # chained: the same block after another parent is another block
    b = extend_hashes([], [9] + BASE[1:], BS)
    assert b[0] != a[0] and all(x != y for x, y in zip(a, b))
    assert hash_block(ROOT, [1, 2, 3, 4], ("adapter", 1)) != hash_block(ROOT, [1, 2, 3, 4])
    # large ids and order matter
    assert hash_block(ROOT, [2**40, 1]) != hash_block(ROOT, [1, 2**40])


def test_hash_is_the_same_in_another_process():
    import subprocess
    import sys

    code = "from core_runner.engine.block_hash import ROOT, hash_block; print(hash_block(ROOT, [5, 6, 7, 8]).hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == hash_block(ROOT, [5, 6, 7, 8]).hex()


# ---- the pool ---------------------------------------------------------------------------
def test_pool_shares_cached_blocks_and_evicts_least_recently_freed_first():
    pool = BlockPool(6)
    a = pool.allocate(3)
    hashes = extend_hashes([], list(range(12)), BS)
    for b, h in zip(a, hashes):
        pool.cache(b, h)
    assert pool.lookup(hashes) == a and pool.lookup([b"x" * 16]) == []
    pool.touch(a[:2])  # a second request shares two blocks
    assert [pool.ref_count[b] for b in a] == [2, 2, 1]
    pool.free(a)  # the first owner finishes: the third block is free but still cached
    assert pool.num_free == 4 and pool.lookup(hashes) == a
    pool.free(a[:2])  # all free now, cached; freed last-first: a[1] before a[0]
    assert pool.num_free == 6
    # uncached blocks go first, then the LRU: a[2] (freed first), then a[1], then a[0]
    got = pool.allocate(4)
    assert set(got[:3]).isdisjoint(a) and got[3] == a[2]
    assert pool.lookup(hashes) == a[:2], "the evicted block's hash must be forgotten"
    got += pool.allocate(1)
    assert got[4] == a[1] and pool.lookup(hashes) == a[:1]
    pool.free(got)
    assert pool.reset() == 1 and pool.lookup(hashes) == [] and pool.num_free == 6


def test_pool_uncache_on_failure_and_duplicate_hashes_keep_the_first_block():
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    h = extend_hashes([], [1, 2, 3, 4], BS)[0]
    pool.cache(a, h)
    pool.cache(b, h)  # the same content computed twice: the first block stays the one found
    assert pool.lookup([h]) == [a]
    pool.free([a], uncache=True)
    assert pool.lookup([h]) == [] and pool.num_free == 3


# ---- the engine -------------------------------------------------------------------------
def _run(llm: LLM, prompts, params=G):
    return llm.generate(prompts, params, use_tqdm=False)


def test_hits_skip_prefill_and_outputs_match(untied, single_torch_thread):
    off = LLM(untied.path, enable_prefix_caching=False, **KW)
    on = LLM(untied.path, **KW)
    assert on.engine.plan.prefix_caching and not off.engine.plan.prefix_caching
    prompts = [BASE + [11, 12], BASE + [13], BASE[:21], BASE + [11, 12]]
    want = [o.outputs[0].token_ids for o in _run(off, prompts)]
    first = _run(on, prompts[:1])
    steps = on.engine.debug.record_steps()
    got = _run(on, prompts)
    assert [o.outputs[0].token_ids for o in got] == want
    assert first[0].num_cached_tokens == 0
    # full blocks before each prompt's last token: 39 -> 36 of BASE, 38 -> 36, 21 -> 20, 39 -> 36
    assert [o.num_cached_tokens for o in got] == [36, 36, 20, 36]
    decode = 4 * len(prompts)  # tokens 2..5 of each request, one per step
    assert sum(s.num_tokens for s in steps) - decode == (39 - 36) + (38 - 36) + (21 - 20) + (39 - 36)
    sched = on.engine.scheduler
    assert sched.prefix_cache_hits == 36 * 3 + 20 and sched.prefix_cache_queries == 39 + 39 + 38 + 21 + 39
    assert on.engine.debug.num_free_blocks == on.engine.num_blocks  # shared blocks all released
    assert on.reset_prefix_cache() is True
    assert _run(on, prompts[:1])[0].num_cached_tokens == 0


def test_chunked_prefill_preemption_abort_and_async(untied, single_torch_thread):
    long_b = BASE + list(range(100, 108))  # 45 tokens: 36 cached, 9 computed in chunks of 6 and 3
    want = [o.outputs[0].token_ids for o in _run(LLM(untied.path, enable_prefix_caching=False, **KW),
                                                  [BASE + [11], long_b])]
    for async_scheduling in (False, True):
        e = LLM(untied.path, max_num_batched_tokens=6, async_scheduling=async_scheduling, **{
            k: v for k, v in KW.items()}).engine
        e.add_request(BASE + [11], G, req_id="a")
        outs = {}
        while e.has_unfinished_requests():
            outs.update({o.req_id: o for o in e.step()})
        # b shares a's prefix, is chunked (budget 6) from its cached offset, then preempted
        # mid-decode and resumed: the resume takes its own cached blocks back
        e.add_request(long_b, G, req_id="b")
        steps = e.debug.record_steps()
        hits_before = e.scheduler.prefix_cache_hits
        if not async_scheduling:  # (async always has b's next sample in flight: not preemptible)
            while not any(s.num_computed.get("b", 0) >= 45 for s in steps):
                e.step()
            e.debug.preempt("b")
        while e.has_unfinished_requests():
            outs.update({o.req_id: o for o in e.step()})
        assert [outs["a"].outputs[0].token_ids, outs["b"].outputs[0].token_ids] == want
        assert outs["b"].num_cached_tokens == 36
        assert outs["b"].num_preemptions == (0 if async_scheduling else 1)
        assert e.scheduler.prefix_cache_hits > hits_before + (0 if async_scheduling else 36)
        b_steps = [(s.num_computed["b"], s.num_scheduled["b"]) for s in steps if "b" in s.num_scheduled]
        assert b_steps[:2] == [(36, 6), (42, 3)], b_steps
        # an aborted request drops its references; its blocks stay cached for the next
        e.add_request(BASE + [14], G, req_id="c")
        e.step()
        e.abort_request("c")
        e.step()
        assert e.debug.num_free_blocks == e.num_blocks and e.debug.rows() == {}
        e.add_request(BASE + [14], G, req_id="d")
        while e.has_unfinished_requests():
            outs.update({o.req_id: o for o in e.step()})
        assert outs["d"].num_cached_tokens == 36


def test_prompt_logprobs_requests_compute_their_whole_prompt(untied, single_torch_thread):
    on = LLM(untied.path, **KW)
    off = LLM(untied.path, enable_prefix_caching=False, **KW)
    p = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=2)
    _run(on, [BASE + [1]])
    got, want = _run(on, [BASE + [2]], p)[0], _run(off, [BASE + [2]], p)[0]
    assert got.num_cached_tokens == 0 and len(got.prompt_logprobs) == len(BASE) + 1
    for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
        assert a.keys() == b.keys() and all(abs(a[k].logprob - b[k].logprob) < 1e-5 for k in a)


def test_a_failed_step_leaves_no_cached_garbage(untied, single_torch_thread):
    module = importlib.import_module("conformance_fixtures.faulty_forward")
    cls = module.FaultyForward
    pm = PluginManager()
    pm.register_module("faulty_forward", module)
    cls.calls, cls.fail_on, cls.nan_on, cls.error = 0, {1}, set(), RuntimeError
    try:
        e = LLM(untied.path, plugins=pm, **KW).engine
        assert e.plan.prefix_caching
        e.add_request(BASE + [11], G, req_id="bad")
        out = e.step()  # the forward computing the prompt raises
        assert [o.finish_reason for o in out] == ["error"]
        assert e.scheduler.pool.cached == {}, "a failed step's blocks must not stay findable"
        e.add_request(BASE + [11], G, req_id="good")
        outs = []
        while e.has_unfinished_requests():
            outs += e.step()
        ref = _run(LLM(untied.path, enable_prefix_caching=False, **KW), [BASE + [11]])[0]
        assert outs[0].num_cached_tokens == 0 and outs[0].outputs[0].token_ids == ref.outputs[0].token_ids
    finally:
        cls.fail_on = set()


def test_tensor_parallel_with_the_cache(untied, single_torch_thread):
    want = [o.outputs[0].token_ids for o in _run(LLM(untied.path, enable_prefix_caching=False, **KW),
                                                  [BASE + [11], BASE + [12]])]
    llm = LLM(untied.path, tensor_parallel_size=2, **KW)
    try:
        assert llm.engine.plan.prefix_caching
        got = _run(llm, [BASE + [11]]) + _run(llm, [BASE + [12]])
        assert [o.outputs[0].token_ids for o in got] == want and got[1].num_cached_tokens == 36
    finally:
        llm.engine.shutdown()


def test_families_without_it_are_off_by_default_and_downgraded_when_asked(tmp_path, caplog):
    import transformers

    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(cfg).save_pretrained(tmp_path)
    opts = dict(device="cpu", dtype="float32", max_model_len=32, max_num_seqs=2, block_size=4, num_kv_blocks=32)
    with caplog.at_level(logging.WARNING):
        e = LLM(str(tmp_path), **opts).engine
    assert not e.plan.prefix_caching and not e.plan.downgrades and "prefix caching" not in caplog.text
    e = LLM(str(tmp_path), enable_prefix_caching=True, **opts).engine
    assert not e.plan.prefix_caching and any(d.startswith("prefix caching off: BertModel declares") for d in
                                             e.plan.downgrades)
    with pytest.raises(UnsupportedError, match="prefix caching"):
        LLM(str(tmp_path), enable_prefix_caching=True, strict=True, **opts)
    with pytest.raises(ValueError, match="enable_prefix_caching='yes' is invalid"):
        LLM(str(tmp_path), enable_prefix_caching="yes", **opts)


def test_embedding_last_token_pooling_hits_mean_pooling_does_not(tmp_path, single_torch_thread):
    import torch
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=128, architectures=["Qwen3Model"])
    torch.manual_seed(0)
    transformers.Qwen3Model(cfg).save_pretrained(tmp_path)
    on = LLM(str(tmp_path), **KW)
    off = LLM(str(tmp_path), enable_prefix_caching=False, **KW)
    assert on.engine.plan.prefix_caching
    for kind, hit in (("last", 36), ("mean", 0)):
        pp = PoolingParams(pooling_type=kind)
        on.embed([BASE + [1]], pp, use_tqdm=False)
        got = on.embed([BASE + [2]], pp, use_tqdm=False)[0]
        want = off.embed([BASE + [2]], pp, use_tqdm=False)[0]
        assert got.num_cached_tokens == hit, kind
        assert torch.allclose(got.outputs.data, want.outputs.data, atol=1e-5), kind
