"""Quick CPU tests of the benchmark workloads and of the transformers peer run (benchmarks/)."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from core_runner.bench.workloads import (  # noqa: E402
    make_random_checkpoint,
    make_workload,
    qwen3_0p6b_config,
    shared_prefix_workload,
    tiny_qwen3_config,
    workload_summary,
)

VOCAB = 151936


# ------------------------------------------------------------------------------------------- #
# Workloads
# ------------------------------------------------------------------------------------------- #


def test_w1_shape_and_determinism():
    wl = make_workload("W1", VOCAB)
    assert len(wl) == 1024
    assert all(len(p) == 128 and o == 256 and t == 0.0 for p, o, t in wl)
    assert all(3 <= tok < VOCAB for p, _, _ in wl for tok in p)
    assert wl == make_workload("w1", VOCAB)  # deterministic, name case-insensitive
    assert wl[0][0] != wl[1][0]  # prompts differ between requests


def test_w2_lengths_follow_seeded_randint():
    wl = make_workload("W2", VOCAB)
    assert len(wl) == 256
    assert all(100 <= len(p) <= 1024 and 100 <= o <= 1024 and t == 0.6 for p, o, t in wl)
    assert all(3 <= tok < VOCAB for p, _, _ in wl for tok in p)
    # The DESIGN recipe: random.seed(0), then per request randint(100, 1024) for prompt, then output.
    state = random.getstate()
    try:
        random.seed(0)
        expected = [(random.randint(100, 1024), random.randint(100, 1024)) for _ in range(256)]
    finally:
        random.setstate(state)
    assert [(len(p), o) for p, o, _ in wl] == expected
    # Token ids come from their own random.Random(0), request after request.
    rng = random.Random(0)
    assert wl[0][0] == [rng.randrange(3, VOCAB) for _ in range(len(wl[0][0]))]
    assert wl == make_workload("W2", VOCAB)


def test_w2_does_not_touch_global_random():
    random.seed(123)
    before = random.random()
    random.seed(123)
    make_workload("W2", VOCAB, 4)
    assert random.random() == before


def test_num_requests_gives_a_prefix():
    for name in ("W1", "W2"):
        full = make_workload(name, VOCAB)
        assert make_workload(name, VOCAB, 10) == full[:10]
        assert make_workload(name, VOCAB, 0) == []
    assert len(make_workload("W2", VOCAB, 300)) == 300  # beyond the default count the stream continues


def test_scale_divides_lengths_without_changing_draws():
    full = make_workload("W2", 512, 5)
    small = make_workload("W2", 512, 5, scale=8)
    for (p, o, t), (sp, so, st) in zip(full, small):
        assert len(sp) == max(1, len(p) // 8) and sp == p[: len(sp)]
        assert so == max(1, o // 8) and st == t


def test_small_vocab_and_bad_arguments():
    wl = make_workload("W1", 8, 3)
    assert all(3 <= tok < 8 for p, _, _ in wl for tok in p)
    with pytest.raises(ValueError, match="'W4'"):
        make_workload("W4", VOCAB)
    with pytest.raises(ValueError):
        make_workload("W1", 3)
    with pytest.raises(ValueError):
        make_workload("W1", VOCAB, scale=0)


def test_w3_draws_shared_system_prompts_then_own_parts():
    wl = make_workload("W3", VOCAB)
    assert len(wl) == 512 and all(o == 128 and t == 0.0 for _, o, t in wl)
    systems = {tuple(p[:1000]) for p, _, _ in wl}
    assert len(systems) == 8
    assert all(50 <= len(p) - 1000 <= 200 for p, _, _ in wl)
    assert all(3 <= tok < VOCAB for p, _, _ in wl for tok in p)
    # one Random(0): the 8 system prompts first, then per request its system prompt, length, tokens
    rng = random.Random(0)
    drawn = [[rng.randrange(3, VOCAB) for _ in range(1000)] for _ in range(8)]
    first = drawn[rng.randrange(8)]
    own = [rng.randrange(3, VOCAB) for _ in range(rng.randint(50, 200))]
    assert wl[0][0] == first + own
    assert make_workload("w3", VOCAB, 10) == wl[:10] and make_workload("W3", VOCAB, 0) == []
    small = make_workload("W3", VOCAB, 4, scale=8)  # each part cut after drawing
    for (p, _, _), (sp, so, _) in zip(wl, small):
        n_own = len(p) - 1000
        assert sp == p[:125] + p[1000:1000 + n_own // 8] and so == 16


def test_shared_prefix_workload_knobs_and_bad_arguments():
    wl = shared_prefix_workload(64, 6, num_prefixes=2, prefix_len=16, suffix_len=(0, 3), output_len=5, seed=1)
    assert len({tuple(p[:16]) for p, _, _ in wl}) <= 2 and all(16 <= len(p) <= 19 and o == 5 for p, o, _ in wl)
    assert wl != shared_prefix_workload(64, 6, num_prefixes=2, prefix_len=16, suffix_len=(0, 3), output_len=5)
    for kw, word in ((dict(num_prefixes=0), "num_prefixes"), (dict(prefix_len=0), "prefix_len"),
                     (dict(suffix_len=(5, 2)), r"\(5, 2\)"), (dict(scale=0), "scale"), (dict(output_len=0), "0")):
        with pytest.raises(ValueError, match=word):
            shared_prefix_workload(64, 2, **kw)
    with pytest.raises(ValueError, match="-1"):
        shared_prefix_workload(64, -1)


def test_workload_summary():
    s = workload_summary(make_workload("W1", VOCAB, 4))
    assert s["num_requests"] == 4 and s["output_tokens"] == 1024 and s["prompt_tokens"] == 512
    assert s["temperatures"] == [0.0]


def test_qwen3_0p6b_config_shape():
    c = qwen3_0p6b_config()
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (151936, 1024, 3072, 28)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 8, 128)
    assert c.max_position_embeddings == 40960 and c.rms_norm_eps == 1e-6 and c.tie_word_embeddings
    rope = getattr(c, "rope_parameters", None) or {}
    assert rope.get("rope_theta", getattr(c, "rope_theta", None)) == 1e6
    assert c.eos_token_id == 151645
    tiny = tiny_qwen3_config()
    assert tiny.vocab_size == 512 and tiny.eos_token_id is None  # real ids dropped from a small vocab
    assert qwen3_0p6b_config(num_hidden_layers=2).num_hidden_layers == 2


# ------------------------------------------------------------------------------------------- #
# Peer helpers
# ------------------------------------------------------------------------------------------- #


def test_length_buckets_cover_everything():
    wl = make_workload("W2", 512, 10)
    buckets = peers._length_buckets(wl, 4)
    assert len(buckets) <= 4
    seen = sorted(i for ix, _ in buckets for i in ix)
    assert seen == list(range(10))
    for ix, mx in buckets:
        assert mx == max(wl[i][1] for i in ix)
    assert len(peers._length_buckets(make_workload("W1", 512, 10), 4)) == 1  # one length, one bucket


def test_count_outputs_checks_lengths():
    req = {"a": ([1], 3), "b": ([1], 2)}
    ok = peers._count_outputs(req, {"a": [5, 5, 5], "b": [5, 5]})
    assert ok["output_tokens"] == 5 and ok["length_check"].startswith("ok")
    short = peers._count_outputs(req, {"a": [5], "b": [5, 5]})
    assert short["output_tokens"] == 3 and short["length_check"].startswith("MISMATCH")
    over = peers._count_outputs(req, {"a": [5] * 4, "b": [5, 5]}, overshoot_ok=True)
    assert over["output_tokens"] == 5 and over["wasted_tokens"] == 1 and over["length_check"].startswith("ok")
    missing = peers._count_outputs(req, {"a": [5, 5, 5]})
    assert "1 missing" in missing["length_check"]


def test_plan_order_on_cpu():
    names = [a["name"] for a in peers._plan_attempts("cpu", 0, ("cb-manager", "cb-generate_batch",
                                                                 "generate-padded"))]
    assert names[0] == "cb-manager/sdpa"
    assert names.index("cb-generate_batch/sdpa") > names.index("cb-manager/paged|eager")
    assert names[-2:] == ["generate-padded/sdpa", "generate-padded/eager"]
    assert not any("flash" in n for n in names)


# ------------------------------------------------------------------------------------------- #
# CPU smoke runs on a tiny random checkpoint
# ------------------------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_qwen3")
    make_random_checkpoint(path, tiny_qwen3_config(), device="cpu")
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 512
    return str(path)


def test_hf_peer_continuous_batching_cpu(tiny_checkpoint):
    wl = make_workload("W2", 512, 4, scale=16)  # prompt/output lengths 6..64, temperature 0.6
    res = peers.run_hf_peer(tiny_checkpoint, wl, device="cpu", timeout_s=50, warmup_requests=2)
    if res["error"] and "available memory 0" in res["error"]:
        # transformers before ~5.2x cannot size its CPU KV cache without psutil (it then fell back).
        assert res["config"].startswith("generate-padded/sdpa") and res["length_check"].startswith("ok")
        pytest.skip("this transformers needs psutil for continuous batching on CPU")
    assert res["error"] is None, res
    assert res["config"].startswith("cb-"), res["attempts"]
    assert res["total_output_tokens"] == sum(o for _, o, _ in wl)
    assert res["length_check"].startswith("ok"), res["length_check"]
    assert res["output_tok_s"] > 0 and res["elapsed_s"] > 0
    assert res["transformers"]
    json.dumps(res)  # JSON-serialisable


def test_hf_peer_falls_back_to_padded_generate(tiny_checkpoint, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("continuous batching unavailable (test)")

    monkeypatch.setattr(peers, "_run_cb_manager", broken)
    monkeypatch.setattr(peers, "_run_cb_generate_batch", broken)
    wl = make_workload("W1", 512, 3, scale=16)  # 8 prompt tokens, 16 output tokens, greedy
    res = peers.run_hf_peer(tiny_checkpoint, wl, device="cpu", timeout_s=50, warmup_requests=1)
    assert res["config"].startswith("generate-padded/sdpa"), res["attempts"]
    assert "continuous batching unavailable" in res["error"]
    assert res["total_output_tokens"] == 3 * 16
    assert res["length_check"].startswith("ok")
    assert [a["error"] is None for a in res["attempts"]][-1]


def test_hf_peer_timeout_reports_error(tiny_checkpoint):
    wl = make_workload("W1", 512, 2, scale=16)
    res = peers.run_hf_peer(tiny_checkpoint, wl, device="cpu", timeout_s=0.0)
    assert res["error"] and "timeout" in res["error"]
    assert res["total_output_tokens"] == 0


def test_roofline_counts_kv_and_recurrent_state():
    from core_runner.bench.roofline import decode_roofline_tok_s

    wl = [([1, 2], 2, 0.0), ([3], 1, 0.0)]
    # step 0: ctx 2 + 1, two live rows; step 1: ctx 3, one live row
    t = (10 + 3 * 4 + 2 * 2 * 5) / 100 + (10 + 3 * 4 + 2 * 1 * 5) / 100
    assert decode_roofline_tok_s(wl, 10, 4, 100.0, 8, state_bytes_per_row=5) == pytest.approx(3 / t)
    assert decode_roofline_tok_s(wl, 10, 4, 100.0, 8) > decode_roofline_tok_s(wl, 10, 4, 100.0, 8, 5)


# ------------------------------------------------------------------------------------------- #
# W3 with the prefix cache on and off (the demo model, float32: peaked logits, so greedy
# outputs do not flip between the two runs' different batchings)
# ------------------------------------------------------------------------------------------- #


def _prompt_tokens_scheduled(steps, workload) -> int:
    """The timed run's prompt tokens, step by step, from the recorded steps (the reference for
    the bench's hook, which visits only requests still in their prompt)."""
    prompt_lens = {f"b{i}": len(p) for i, (p, _, _) in enumerate(workload)}
    total = 0
    for st in steps:
        if not all(rid in prompt_lens for rid in st.num_scheduled):
            continue  # a warm-up step
        for rid, n in st.num_scheduled.items():
            start, num_prompt = st.num_computed[rid], prompt_lens[rid]
            total += max(0, min(start + n, num_prompt) - start)
    return total


def _demo_llm(**kw):
    from core_runner import LLM
    from core_runner.demo import demo_checkpoint

    opts = dict(device="cpu", dtype="float32", block_size=16, max_model_len=256, max_num_seqs=8,
                max_num_batched_tokens=1024)
    return LLM(demo_checkpoint(), **{**opts, **kw})


def test_w3_with_the_prefix_cache_computes_fewer_prompt_tokens_and_the_same_outputs(single_torch_thread):
    from core_runner.bench.run import compare_prefix_caching, format_comparison, run_engine

    # 2 system prompts of 4 blocks; all 8 requests are admitted in the first step, and each
    # after the first of its system prompt takes that prompt's 64 tokens from the cache
    wl = shared_prefix_workload(2048, 8, num_prefixes=2, prefix_len=64, suffix_len=(4, 12), output_len=6)
    firsts = len({tuple(p[:64]) for p, _, _ in wl})
    runs = {}
    for on in (True, False):
        llm = _demo_llm(enable_prefix_caching=on)
        assert llm.engine.plan.prefix_caching is on
        steps = llm.engine.debug.record_steps()
        res = run_engine(llm, wl, keep_outputs=True)
        assert res["prefill_tokens_computed"] == _prompt_tokens_scheduled(steps, wl)
        runs[on] = res
    prompt = sum(len(p) for p, _, _ in wl)
    on, off = runs[True], runs[False]
    assert on["preemptions"] == off["preemptions"] == 0
    assert off["prefill_tokens_computed"] == prompt and off["prefix_cache_hits"] == 0
    assert on["prefix_cache_hits"] == 64 * (8 - firsts) > 0 and on["prefix_cache_queries"] == prompt
    assert on["prefill_tokens_computed"] == prompt - on["prefix_cache_hits"]
    cmp = compare_prefix_caching(on, off)
    assert cmp["identical_outputs"] == cmp["num_requests"] == 8
    assert all(len(t) == 6 for t in on["output_token_ids"])
    assert cmp["prefill_tokens_off_over_on"] == pytest.approx(prompt / (prompt - 64 * (8 - firsts)))
    assert "identical outputs 8/8" in format_comparison("W3", cmp)


def test_prompt_tokens_computed_count_a_preempted_prompt_again(single_torch_thread):
    """With too few KV blocks requests are preempted and compute their prompts again: the
    count is what the engine scheduled, above the prompt tokens (hits and queries cannot say)."""
    from core_runner.bench.run import run_engine

    wl = shared_prefix_workload(2048, 6, num_prefixes=6, prefix_len=40, suffix_len=(8, 8), output_len=16)
    llm = _demo_llm(enable_prefix_caching=False, max_model_len=128, num_kv_blocks=12)
    steps = llm.engine.debug.record_steps()
    res = run_engine(llm, wl)
    assert res["preemptions"] > 0
    assert res["prefill_tokens_computed"] == _prompt_tokens_scheduled(steps, wl) > res["prompt_tokens"] == 6 * 48


def test_bench_cli_runs_w3_with_the_cache_on_and_off(tmp_path, capsys, single_torch_thread):
    from core_runner.cli import main
    from core_runner.demo import demo_checkpoint

    out = tmp_path / "w3.json"
    rc = main(["bench", "--model", demo_checkpoint(), "--device", "cpu", "--dtype", "float32", "--workload", "W3",
               "--num-requests", "12", "--scale", "16", "--prefix-caching", "on", "off", "--json", str(out),
               "--max-model-len", "256", "--max-num-seqs", "16", "--max-num-batched-tokens", "512"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res) == {"W3_prefix_caching_on", "W3_prefix_caching_off", "W3_prefix_caching_on_vs_off"}
    on, off, cmp = res["W3_prefix_caching_on"], res["W3_prefix_caching_off"], res["W3_prefix_caching_on_vs_off"]
    assert on["prefix_caching"] and not off["prefix_caching"] and "output_token_ids" not in on
    assert on["prompt_tokens"] == off["prompt_tokens"] == off["prefill_tokens_computed"]
    assert on["prefill_tokens_computed"] < off["prefill_tokens_computed"] and on["prefix_cache_hits"] > 0
    assert cmp["identical_outputs"] == cmp["num_requests"] == 12
    printed = capsys.readouterr().out
    assert "W3 prefix caching on vs off" in printed and f"{cmp['prefill_tokens_off_over_on']:.2f}x fewer" in printed


def test_profile_pass_profiles_prefill_steps_that_compute(single_torch_thread):
    """The profile pass empties the prefix cache first, so its prefill steps compute the prompts
    the timed pass left cached; they are profiled on the host too (the device part needs CUDA)."""
    from core_runner.bench.run import run_engine

    wl = [(p[:24], 4, 0.0) for p, _, _ in make_workload("W1", 2048, 64)]
    llm = _demo_llm(max_model_len=64, max_num_seqs=64, max_num_batched_tokens=256)
    res = run_engine(llm, wl, profile_steps=1)
    assert res["prefill_tokens_computed"] == 64 * 24 and res["prefix_cache_hits"] == 0
    # the profile pass adds the same 64 prompts again: a kept cache would hit a block of each
    assert llm.engine.scheduler.prefix_cache_hits == 0 and llm.engine.plan.prefix_caching
    assert res["prefill_step_ms_profiled"] > 0
    host = res["prefill_host_top"]
    assert host and all(k["tot_ms_per_step"] >= 0 and k["calls_per_step"] > 0 for k in host)


def test_time_ms_runs_the_warmup_then_the_timed_calls():
    from core_runner.bench.timing import time_ms

    calls = []
    ms = time_ms(lambda: calls.append(1), iters=5, warmup=2, cuda=False)
    assert len(calls) == 7 and ms >= 0.0
