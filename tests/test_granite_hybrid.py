"""core-runner's GraniteMoeHybrid plugin (Mamba2 + attention) against
transformers.GraniteMoeHybridForCausalLM (CPU, float32, tiny random configs).

Two checkpoints: dense + NoPE attention, and MoE + RoPE attention (untied head). The
scan chunk size is 8, so prompts of 7, 13, 30 tokens end mid-chunk. References are
computed one prompt at a time (batch 1, all-ones attention mask).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import (
    Checkpoint,
    Recorder,
    assert_logits_match_hf,
    drain,
    greedy,
    hf_greedy,
    hf_logits,
    make_engine,
    random_prompts,
    run,
    snapshot,
    snapshot_diff,
)

LOGIT_ATOL = 1e-4
VOCAB = 256


def _reference_norm_is_grouped() -> bool:
    """transformers 5.17 (not 5.24) normalises the gated RMSNorm over all of d_inner, ignoring
    mamba_n_groups (mamba_ssm and later transformers normalise per group, as core-runner
    does), so n_groups > 1 is compared only where the reference is right."""
    import inspect

    from transformers.models.granitemoehybrid import modeling_granitemoehybrid as m

    return "group_size" in inspect.signature(m.GraniteMoeHybridRMSNormGated.__init__).parameters


N_GROUPS = 2 if _reference_norm_is_grouped() else 1
BASE = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
    mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=N_GROUPS, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=8, shared_intermediate_size=96, intermediate_size=32,
    embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.0,
    initializer_range=0.2, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
SPECS = {
    "dense_nope": dict(num_local_experts=0, position_embedding_type=None, tie_word_embeddings=True, seed=0),
    "moe_rope": dict(num_local_experts=4, num_experts_per_tok=2, position_embedding_type="rope",
                     tie_word_embeddings=False, seed=1),
}
MAX_ERR: dict[str, float] = {}


def _build(root, name: str) -> Checkpoint:
    import transformers

    spec = dict(SPECS[name])
    seed = spec.pop("seed")
    cfg = transformers.GraniteMoeHybridConfig(**{**BASE, **spec})
    torch.manual_seed(seed)
    hf = transformers.GraniteMoeHybridForCausalLM(cfg).to(torch.float32).eval()
    path = root / name
    hf.save_pretrained(str(path))
    return Checkpoint(name=name, path=str(path), hf=hf, vocab=VOCAB)


@pytest.fixture(scope="module")
def granite(tmp_path_factory, single_torch_thread):
    root = tmp_path_factory.mktemp("granite_tiny")
    return {name: _build(root, name) for name in SPECS}


@pytest.fixture(scope="module", params=list(SPECS))
def gckpt(request, granite):
    return granite[request.param]


def _max_err(ckpt: Checkpoint, rec: Recorder, outs: dict) -> float:
    worst = 0.0
    for req_id, out in outs.items():
        seq = list(out.prompt_token_ids) + list(out.token_ids)
        ref = hf_logits(ckpt, seq[:-1])
        for pos, lg in rec.logits_of(req_id):
            worst = max(worst, (lg - ref[pos]).abs().max().item())
    MAX_ERR[ckpt.name] = max(MAX_ERR.get(ckpt.name, 0.0), worst)
    return worst


# ---------------------------------------------------------------------------------
# 1. logits
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [None, 5])
def test_logits_match_hf(gckpt, budget):
    lengths = [1, 7, 8, 13, 30]
    prompts = random_prompts(lengths, seed=5, vocab=VOCAB)
    opts = {} if budget is None else {"max_num_batched_tokens": budget}
    engine = make_engine(gckpt, max_model_len=64, max_num_seqs=8, **opts)
    rec = Recorder(engine)
    outs = run(engine, [(f"r{i}", p, greedy(5)) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(gckpt, p, 5), f"r{i} (len {len(p)})"
    if budget is None:
        first = rec.steps[0]
        assert first.num_scheduled == {f"r{i}": n for i, n in enumerate(lengths)}
    else:
        assert max(s.num_tokens for s in rec.steps) <= budget
    checked = assert_logits_match_hf(gckpt, rec, outs, atol=LOGIT_ATOL)
    assert checked >= len(prompts) * 5
    assert _max_err(gckpt, rec, outs) <= LOGIT_ATOL


def test_continuations_are_informative(granite):
    """The references are worth comparing against: greedy continuations vary."""
    for ckpt in granite.values():
        prompts = random_prompts([9, 14, 21], seed=3, vocab=VOCAB)
        assert sum(len(set(hf_greedy(ckpt, p, 12))) >= 4 for p in prompts) >= 2, ckpt.name


# ---------------------------------------------------------------------------------
# 2. greedy tokens under scheduling variations, sync and async
# ---------------------------------------------------------------------------------
LENGTHS = [1, 30, 2, 7, 13, 21, 9, 17]
N_NEW = 10
SCENARIOS = {
    "chunked_7": dict(max_num_batched_tokens=7),
    "chunked_7_async": dict(max_num_batched_tokens=7, async_scheduling=True),
    "preempt": dict(max_model_len=48, block_size=4, num_kv_blocks=14),
    "preempt_chunked_async": dict(max_model_len=48, block_size=4, num_kv_blocks=15, max_num_batched_tokens=9,
                                  async_scheduling=True),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_greedy_matches_hf(gckpt, scenario):
    opts = {"max_model_len": 64, **SCENARIOS[scenario]}
    prompts = random_prompts(LENGTHS, seed=11, vocab=VOCAB)
    engine = make_engine(gckpt, **opts)
    rec = Recorder(engine)
    outs = run(engine, [(f"p{i}", p, greedy(N_NEW)) for i, p in enumerate(prompts)])
    bad = [f"p{i} (len {len(p)}, {outs[f'p{i}'].num_preemptions} preemptions)"
           for i, p in enumerate(prompts) if outs[f"p{i}"].token_ids != hf_greedy(gckpt, p, N_NEW)]
    assert not bad, f"{scenario}: " + "; ".join(bad)
    if "chunked" in scenario:
        assert any(r not in s.new_req_ids and 0 < s.num_computed[r] < len(prompts[int(r[1:])])
                   for s in rec.steps for r in s.req_ids), "no prompt was split into chunks"
    if "preempt" in scenario:
        assert engine.scheduler.num_preemptions > 0, "the small KV pool never preempted"
    assert engine.plan.async_scheduling == bool(opts.get("async_scheduling"))
    assert engine.scheduler.pool.num_free == engine.num_blocks


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_staggered_arrivals(granite, async_scheduling):
    """Requests join while others decode or are mid-prefill: every batch composition."""
    ckpt = granite["moe_rope"]
    engine = make_engine(ckpt, max_model_len=64, max_num_seqs=3, max_num_batched_tokens=6,
                         async_scheduling=async_scheduling)
    prompts = random_prompts([5, 18, 1, 11, 26, 3], seed=21, vocab=VOCAB)
    outs: dict = {}
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(8), req_id=f"s{i}")
        for _ in range(i % 3 + 1):
            for o in engine.step():
                outs[o.req_id] = o
    drain(engine, outs)
    for i, p in enumerate(prompts):
        assert outs[f"s{i}"].token_ids == hf_greedy(ckpt, p, 8), f"s{i}"


# ---------------------------------------------------------------------------------
# 3. row state hygiene and dummy runs
# ---------------------------------------------------------------------------------
def test_add_request_resets_row(granite):
    engine = make_engine(granite["dense_nope"], max_model_len=32, max_num_seqs=2)
    ms = engine.model_state
    bufs = ms.row_buffers()
    assert len(bufs) == 2 * 3  # conv + SSM state of each of the 3 Mamba layers
    for t in bufs.values():
        assert t.shape[0] == engine.config.max_num_seqs + 1
        t.fill_(7.0)
    # the state reads nothing from the request; a stand-in keeps the test independent of
    # NewRequest's fields (which other features extend)
    ms.add_request(1, SimpleNamespace(req_id="x", token_ids=[3, 4], num_prompt_tokens=2, block_ids=[]))
    ms.apply_staged_writes()
    for name, t in bufs.items():
        assert torch.count_nonzero(t[1]) == 0, name
        assert bool((t[0] == 7.0).all()) and bool((t[2] == 7.0).all()), f"{name}: other rows changed"


def test_reused_row_equals_fresh_engine(granite):
    ckpt = granite["moe_rope"]
    a, b = random_prompts([12, 15], seed=31, vocab=VOCAB)
    fresh = make_engine(ckpt, max_model_len=64, max_num_seqs=1)
    fresh_rec = Recorder(fresh)
    ref = run(fresh, [("b", b, greedy(8))])["b"]

    engine = make_engine(ckpt, max_model_len=64, max_num_seqs=1)
    rec = Recorder(engine)
    run(engine, [("a", a, greedy(8))])
    gen = torch.Generator().manual_seed(0)
    for t in engine.model_state.row_buffers().values():  # garbage in every row, scratch included
        t.copy_(torch.randn(t.shape, generator=gen) * 5)
    out = run(engine, [("b", b, greedy(8))])["b"]
    assert rec.rows_of("a")[0] == rec.rows_of("b")[0] == 0
    assert out.token_ids == ref.token_ids == hf_greedy(ckpt, b, 8)
    got, want = rec.logits_of("b"), fresh_rec.logits_of("b")
    assert [p for p, _ in got] == [p for p, _ in want]
    for (_, x), (_, y) in zip(got, want):
        assert torch.equal(x, y)


def test_dummy_run_changes_no_state(granite):
    engine = make_engine(granite["dense_nope"], max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8)
    prompts = random_prompts([6, 19], seed=41, vocab=VOCAB)
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(6), req_id=f"d{i}")
    outs: dict = {}
    for _ in range(3):  # one request decoding, the other mid-prefill
        for o in engine.step():
            outs[o.req_id] = o
    gen = torch.Generator().manual_seed(1)
    scratch = engine.runner.req_state.scratch_row
    for t in engine.model_state.row_buffers().values():
        t[scratch] = torch.randn(t[scratch].shape, generator=gen)
    before = snapshot(engine)
    for n_reqs, n_tok in [(1, 1), (3, 3), (2, 11), (4, 8)]:
        engine.dummy_run(n_reqs, n_tok)
    assert snapshot_diff(before, snapshot(engine)) == []
    drain(engine, outs)
    for i, p in enumerate(prompts):
        assert outs[f"d{i}"].token_ids == hf_greedy(granite["dense_nope"], p, 6)


# ---------------------------------------------------------------------------------
# 4. registration and the prefix-caching option
# ---------------------------------------------------------------------------------
def test_registration():
    from core_runner.plugins import load_plugins

    reg = load_plugins().registry.get("GraniteMoeHybridForCausalLM")
    assert reg.plugin == "granite_hybrid"
    assert reg.capability("prefix_caching").state == "supported"  # row-state snapshots
    assert reg.capability("chunked_prefill").supported and reg.capability("async_scheduling").supported


def test_prefix_caching_on_by_default_for_granite(granite):
    from core_runner import LLM

    llm = LLM(granite["dense_nope"].path, dtype="float32", max_model_len=32, max_num_seqs=2, num_kv_blocks=32,
              strict=True)
    assert llm.engine.plan.prefix_caching and llm.engine.scheduler.state_interval == 512
    assert llm.engine.memory_report()["state_snapshot_slots"] == 2


def test_prefix_caching_follows_the_declared_capability():
    """A family declaring prefix_caching gets it by default (a hybrid that declares it
    wrongly is caught by CR-EQ-09: tests/test_conformance_prefix.py); one that does not is
    off by default and downgraded by name when asked."""
    from core_runner.config import EngineConfig
    from core_runner.oracle import plan_execution
    from core_runner.registry import Registry

    r = Registry()
    r.add("FakeForCausalLM", "m:M", "s:S", capabilities={"prefix_caching": "supported"})
    r.add("OtherForCausalLM", "m:M", "s:S", capabilities={"prefix_caching": "unsupported"})
    yes, no = r.get("FakeForCausalLM"), r.get("OtherForCausalLM")
    assert plan_execution(EngineConfig(model="x", device="cpu"), yes).prefix_caching
    assert not plan_execution(EngineConfig(model="x", device="cpu", enable_prefix_caching=False), yes).prefix_caching
    plan = plan_execution(EngineConfig(model="x", device="cpu"), no)
    assert not plan.prefix_caching and plan.downgrades == ()
    plan = plan_execution(EngineConfig(model="x", device="cpu", enable_prefix_caching=True, strict=False), no)
    assert not plan.prefix_caching and plan.downgrades[0].startswith("prefix caching off: OtherForCausalLM")
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(model="x", enable_prefix_caching="yes")


def test_report_max_logit_error():
    """Prints the worst logit error seen by the tests above (pytest -s to see it)."""
    for name, err in MAX_ERR.items():
        print(f"granite {name}: max |logit - HF| = {err:.3g}")
        assert err <= LOGIT_ATOL
