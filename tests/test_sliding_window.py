"""Sliding windows through the engine: Qwen3 configs with windowed layers against
transformers (fp32, CPU), the blocks each KV cache group holds, prefix-cache hits past
the window, preemption, and speculation's rollback margin.

The checkpoint mixes two full-attention layers with two windowed ones (Qwen3's
``max_window_layers``), so the engine keeps two KV cache groups that share memory; the
all-windowed variant keeps one group that frees its blocks."""
from __future__ import annotations

import pytest
import torch
from helpers import TINY, Checkpoint, Recorder, assert_logits_match_hf, random_prompts, run

from core_runner import LLM, SamplingParams
from core_runner.kv_cache_groups import plan_kv_cache_layout
from core_runner.kv_cache_spec import PagedCacheSpec

WINDOW, BS = 8, 4


def _ckpt(root, name: str, max_window_layers: int) -> Checkpoint:
    import transformers

    cfg = transformers.Qwen3Config(**{**TINY, "num_hidden_layers": 4, "use_sliding_window": True,
                                      "sliding_window": WINDOW, "max_window_layers": max_window_layers,
                                      "tie_word_embeddings": False})
    cfg._attn_implementation = "eager"
    torch.manual_seed(3)
    hf = transformers.Qwen3ForCausalLM(cfg).float().eval()
    path = root / name
    hf.save_pretrained(str(path))
    return Checkpoint(name=name, path=str(path), hf=hf)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return _ckpt(tmp_path_factory.mktemp("swa"), "mixed", max_window_layers=2)


@pytest.fixture(scope="module")
def all_windowed(tmp_path_factory):
    return _ckpt(tmp_path_factory.mktemp("swa"), "all", max_window_layers=0)


def _llm(ckpt, **kw):
    opts = dict(device="cpu", dtype="float32", max_model_len=160, max_num_seqs=4, block_size=BS,
                num_kv_blocks=200, max_num_batched_tokens=16)
    opts.update(kw)
    return LLM(ckpt.path, **opts)


def test_layout_groups_and_shares_memory():
    spec = dict(num_heads=2, head_size=16, dtype=torch.float32)
    specs = [PagedCacheSpec(f"l{i}", sliding_window=w, **spec) for i, w in enumerate([None, 8, 8, 8, 8, 8, None])]
    layout = plan_kv_cache_layout(specs)
    # two full layers -> chunks of two: one full group, three windowed (the last one short)
    assert [g.sliding_window for g in layout.groups] == [None, 8, 8, 8]
    assert [len(g.layer_names) for g in layout.groups] == [2, 2, 2, 1]
    assert len(layout.slots) == 2, "layer j of every group shares slot tensor j"
    per_layer = specs[0].bytes_per_token()
    assert layout.pool_bytes_per_token(specs) == 2 * per_layer
    caches = layout.allocate(specs, 3, BS, "cpu")
    # groups: (l0, l6) full, (l1, l2), (l3, l4), (l5) windowed; slot j = layer j of each
    assert caches["l0"] is caches["l1"] is caches["l3"] is caches["l5"]
    assert caches["l6"] is caches["l2"] is caches["l4"] and caches["l0"] is not caches["l6"]
    # one window kind: one group, every layer its own tensor
    one = plan_kv_cache_layout([PagedCacheSpec(f"l{i}", sliding_window=8, **spec) for i in range(3)])
    assert one.num_groups == 1 and one.groups[0].sliding_window == 8 and not one.slots


@pytest.mark.parametrize("name", ["mixed", "all_windowed"])
def test_logits_match_transformers_past_several_windows(name, request):
    ckpt = request.getfixturevalue(name)
    llm = _llm(ckpt)
    eng = llm.engine
    assert eng.memory_report()["kv_cache_groups"] == (2 if name == "mixed" else 1)
    rec = Recorder(eng)
    prompts = random_prompts([61, 5, 30], seed=4)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = run(eng, [(f"r{i}", p, params) for i, p in enumerate(prompts)])
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= 3 * 12


def test_windowed_group_holds_about_one_window(mixed):
    eng = _llm(mixed, max_num_batched_tokens=8).engine
    prompt = random_prompts([120], seed=5)[0]
    eng.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), req_id="long")
    peak = [0, 0]
    while eng.has_unfinished_requests():
        eng.step()
        if "long" in eng.scheduler.requests:
            held = eng.debug.blocks_held("long")
            peak = [max(a, b) for a, b in zip(peak, held)]
    full, windowed = peak
    assert full == -(-(120 + 4) // BS), f"the full group holds the whole sequence: {peak}"
    # the window (8) + a step's tokens (8) over blocks of 4, plus a partial block at each end
    assert windowed <= -(-(WINDOW - 1 + 8) // BS) + 1, f"the windowed group must follow the window: {peak}"
    assert eng.debug.num_free_blocks == eng.num_blocks, "every block comes back"


def test_prefix_hit_past_the_window_and_preemption_match_cache_off(all_windowed):
    base = random_prompts([70], seed=6)[0]
    prompts = [base + [5, 6, 7], base + [9, 10, 11, 12, 13]]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in _llm(all_windowed, enable_prefix_caching=False).generate(
        prompts, params, use_tqdm=False)]
    llm = _llm(all_windowed, enable_prefix_caching=True)
    first = llm.generate(prompts[:1], params, use_tqdm=False)[0]
    second = llm.generate(prompts[1:], params, use_tqdm=False)[0]
    assert second.num_cached_tokens >= 64, f"a hit past the window was expected, got {second.num_cached_tokens}"
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == want
    # a preempted request re-prefills (with the cache: from a hit) and continues the same
    eng = llm.engine
    eng.add_request(prompts[1], params, req_id="p")
    got = {}
    for _ in range(200):
        for o in eng.step():
            got[o.req_id] = o
        req = eng.scheduler.requests.get("p")
        if req is not None and len(req.output_token_ids) == 3 and "p" in eng.debug.preemptible():
            eng.debug.preempt("p")
        if not eng.has_unfinished_requests():
            break
    assert got["p"].outputs[0].token_ids == want[1]
    assert eng.debug.num_free_blocks == eng.num_blocks


def test_ngram_speculation_keeps_the_rollback_margin(mixed):
    prompt = [7, 8, 9, 10] * 12  # repetitive: the n-gram proposer finds matches
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    want = _llm(mixed).generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    spec = _llm(mixed, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                           "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    got = spec.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == want
