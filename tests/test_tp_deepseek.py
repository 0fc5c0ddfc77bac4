"""DeepSeek under tensor and expert parallelism (the engine's ``tensor_parallel_size`` /
``enable_expert_parallel``, gloo on the CPU): TP=2 and TP=4, with and without EP, equal TP=1.

Checkpoints are the plugin's own conformance examples: DeepSeek-V2-Lite's shape (YaRN
with mscale 0.707, direct q_proj, two shared experts) and DeepSeek-V3's (q_lora, sigmoid
routing with a correction bias, fp8 block-quantized weights whose 16-wide blocks the
TP=4 shared-expert split cuts through). Greedy tokens must equal TP=1's and every
recorded logits row (prefill chunk ends and decodes) must be within 1e-4; rank 0's
layers must hold their share of the heads and the whole latent cache.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Checkpoint, Recorder, greedy, make_engine, random_prompts, run

CHECKPOINTS = {  # name -> (architecture, conformance example)
    "v2-lite-yarn": ("DeepseekV2ForCausalLM", "deepseek-v2-lite-shape"),
    "v3-qlora-fp8": ("DeepseekV3ForCausalLM", "deepseek-v3-fp8-shape"),
}
# (engine options, prompt lengths, new tokens): one batch of mixed lengths, and chunked
# prefill (8-token budget) with decodes of earlier requests riding along
SCENARIOS = {
    "batch": (dict(), [1, 7, 23], 6),
    "chunked": (dict(max_num_batched_tokens=8), [3, 14, 27], 6),
}
ATOL = 1e-4


def _build(root: Path, name: str) -> str:
    from core_runner.conformance.harness import Reference, examples_of
    from core_runner.plugins import load_plugins

    arch, example = CHECKPOINTS[name]
    reg = load_plugins(["deepseek"]).registry.get(arch)
    ex = next(e for e in examples_of(reg) if e.name == example)
    return str(Reference(reg, ex, root).path)


def _generate(path: str, scenario: str, **engine_opts) -> dict:
    """Greedy tokens, recorded logits (rank 0's) and the layout facts of one engine run
    driven from this process."""
    opts, lens, n = SCENARIOS[scenario]
    engine = make_engine(Checkpoint(name=Path(path).name, path=path, hf=None), max_model_len=64, max_num_seqs=4,
                         **opts, **engine_opts)
    try:
        rec = Recorder(engine)
        prompts = random_prompts(lens, seed=3, vocab=engine.vocab_size)
        outs = run(engine, [(f"r{i}", p, greedy(n)) for i, p in enumerate(prompts)])
    finally:
        engine.shutdown()
    attn = engine.runner.model.model.layers[0].self_attn
    moe = engine.runner.model.model.layers[-1].mlp
    return {
        "tokens": {rid: list(o.token_ids) for rid, o in outs.items()},
        "logits": {rid: rec.logits_of(rid) for rid in outs},
        "chunked": any(s.num_scheduled[r] < len(prompts[int(r[1:])]) for s in rec.steps for r in s.num_scheduled
                       if s.num_computed[r] == 0),
        "heads": attn.attn.num_heads,
        "kv_b_rows": attn.kv_b_proj.weight.shape[0],
        "o_proj_cols": attn.o_proj.weight.shape[1],
        "experts_w13": tuple(moe.experts.w13.weight.shape),
        "shared_down_cols": moe.shared_experts.down_proj.weight.shape[1],
        "kv_cache_shapes": sorted(tuple(c.shape) for c in engine.runner.kv_caches.values()),
        "kv_bytes_per_token": engine.memory_report()["kv_bytes_per_token"],
    }


@pytest.fixture(scope="module")
def tp1(tmp_path_factory, single_torch_thread):
    """name -> (checkpoint path, {scenario: the TP=1 run})."""
    root = tmp_path_factory.mktemp("deepseek_tp")
    out = {}
    for name in CHECKPOINTS:
        path = _build(root, name)
        out[name] = (path, {s: _generate(path, s) for s in SCENARIOS})
    return out


# (tensor_parallel_size, enable_expert_parallel, checkpoint, scenario)
CASES = [
    (2, False, "v2-lite-yarn", "batch"), (2, False, "v2-lite-yarn", "chunked"),
    (2, False, "v3-qlora-fp8", "batch"), (2, False, "v3-qlora-fp8", "chunked"),
    # one head per rank; V3's 40-wide shared experts split into 10 across its 16-wide fp8 blocks
    (4, False, "v2-lite-yarn", "batch"), (4, False, "v3-qlora-fp8", "chunked"),
    # whole experts per rank: V2-Lite's 8 two to a rank, V3's 16 four (or eight) to a rank
    (4, True, "v2-lite-yarn", "chunked"), (4, True, "v3-qlora-fp8", "batch"), (2, True, "v3-qlora-fp8", "chunked"),
]


@pytest.mark.parametrize("tp,ep,name,scenario", CASES, ids=[f"tp{c[0]}{'-ep' if c[1] else ''}-{c[2]}-{c[3]}"
                                                              for c in CASES])
def test_tensor_parallel_equals_one_rank(tp1, tp, ep, name, scenario):
    path, want_runs = tp1[name]
    want = want_runs[scenario]
    got = _generate(path, scenario, tensor_parallel_size=tp, enable_expert_parallel=ep)
    assert got["tokens"] == want["tokens"]
    assert got["chunked"] == want["chunked"] == (scenario == "chunked")
    checked = 0
    for rid, rows in want["logits"].items():
        assert [p for p, _ in got["logits"][rid]] == [p for p, _ in rows], rid
        for (pos, lg), (_, ref) in zip(got["logits"][rid], rows):
            err = (lg - ref).abs().max().item()
            assert err <= ATOL, f"{rid}: logits at position {pos} differ from TP=1 by {err:.3g}"
            checked += 1
    assert checked >= len(want["tokens"]) * SCENARIOS[scenario][2]
    # rank 0 holds its share of the heads, of the shared experts' intermediate units and of
    # the routed experts (1/tp of each, or 1/tp of them whole); the latent cache is whole
    experts, rows, cols = got["experts_w13"]
    local = (experts * tp, rows, cols) if ep else (experts, rows * tp, cols)
    assert local == want["experts_w13"]
    assert got["shared_down_cols"] * tp == want["shared_down_cols"]
    assert got["heads"] * tp == want["heads"]
    assert got["kv_b_rows"] * tp == want["kv_b_rows"] and got["o_proj_cols"] * tp == want["o_proj_cols"]
    assert got["kv_cache_shapes"] == want["kv_cache_shapes"]
    assert got["kv_bytes_per_token"] == want["kv_bytes_per_token"]


def test_heads_not_divisible_by_tp_is_refused():
    import transformers
    from core_runner_deepseek.model import DeepseekV3ForCausalLM

    from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group

    cfg = transformers.DeepseekV3Config(
        vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, n_routed_experts=3, num_experts_per_tok=1, n_group=1, topk_group=1)
    prev = set_tp_group(GroupCoordinator(rank=0, world_size=3))
    try:
        with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tensor_parallel_size=3"):
            DeepseekV3ForCausalLM(cfg)
    finally:
        set_tp_group(prev)


def test_parallel_capabilities_declared():
    import tomllib

    from core_runner.plugins import load_plugins

    table = tomllib.loads((Path(__file__).parents[1] / "registry.toml").read_text())["architectures"]
    registry = load_plugins(["deepseek"]).registry
    for arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        for cap in ("tensor_parallel", "expert_parallel"):
            assert registry.get(arch).capability(cap).state == "supported", (arch, cap)
            assert table[arch]["capabilities"][cap] == "supported", (arch, cap)
