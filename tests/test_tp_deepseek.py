"""DeepSeek under tensor and expert parallelism: TP=2, and TP=4 with EP, equal TP=1.

Checkpoints are the plugin's own conformance examples: DeepSeek-V2-Lite's shape (YaRN
with mscale 0.707, direct q_proj, two shared experts) and DeepSeek-V3's (q_lora, sigmoid
routing with a correction bias, fp8 block-quantized weights whose 16-wide blocks the
TP=4 shared-expert split cuts through).

Most tests run, on each rank, an unmodified single-process engine over a model built
with the rank's TP group installed (SPMD): every rank schedules the same requests in the
same order, so the collectives inside the layers line up (several checkpoints and
schedules per spawn, cheaply). One goes through the engine's own
``tensor_parallel_size``. Every rank's greedy tokens must equal TP=1's
and every recorded logits row (prefill chunk ends and decodes) must be within 1e-4.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import Checkpoint, Recorder, greedy, make_engine, random_prompts, run
from tp_harness import run_ranks

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
    return {
        "tokens": {rid: list(o.token_ids) for rid, o in outs.items()},
        "logits": {rid: rec.logits_of(rid) for rid in outs},
        "chunked": any(s.num_scheduled[r] < len(prompts[int(r[1:])]) for s in rec.steps for r in s.num_scheduled
                       if s.num_computed[r] == 0),
        "heads": attn.attn.num_heads,
        "kv_b_rows": attn.kv_b_proj.weight.shape[0],
        "o_proj_cols": attn.o_proj.weight.shape[1],
        "kv_cache_shapes": sorted(tuple(c.shape) for c in engine.runner.kv_caches.values()),
        "kv_bytes_per_token": engine.memory_report()["kv_bytes_per_token"],
    }


def _spmd(runs: list[tuple[str, str]]) -> list[dict]:
    torch.set_num_threads(1)
    results = [_generate(path, scenario) for path, scenario in runs]
    # torch's queue passes tensors as shared-memory handles that die with this rank
    # before the parent reads them; numpy arrays travel by value
    for r in results:
        r["logits"] = {rid: [(p, lg.numpy()) for p, lg in rows] for rid, rows in r["logits"].items()}
    return results


@pytest.fixture(scope="module")
def tp1(tmp_path_factory, single_torch_thread):
    """name -> (checkpoint path, {scenario: the TP=1 run})."""
    root = tmp_path_factory.mktemp("deepseek_tp")
    out = {}
    for name in CHECKPOINTS:
        path = _build(root, name)
        out[name] = (path, {s: _generate(path, s) for s in SCENARIOS})
    return out


def _assert_equal_to_tp1(tp1: dict, runs: list[tuple[str, str]], per_rank: list[list[dict]], tp: int) -> None:
    for rank, results in enumerate(per_rank):
        for (name, scenario), got in zip(runs, results):
            want = tp1[name][1][scenario]
            where = f"{name}/{scenario} TP={tp} rank {rank}"
            assert got["tokens"] == want["tokens"], where
            assert got["chunked"] == want["chunked"] == (scenario == "chunked"), where
            checked = 0
            for rid, rows in want["logits"].items():
                assert [p for p, _ in got["logits"][rid]] == [p for p, _ in rows], f"{where} {rid}"
                for (pos, lg), (_, ref) in zip(got["logits"][rid], rows):
                    err = (torch.as_tensor(lg) - ref).abs().max().item()
                    assert err <= ATOL, f"{where} {rid}: logits at position {pos} differ by {err:.3g}"
                    checked += 1
            assert checked >= len(want["tokens"]) * 6, where
            # heads split, the latent cache whole on every rank
            assert got["heads"] * tp == want["heads"], where
            assert got["kv_b_rows"] * tp == want["kv_b_rows"] and got["o_proj_cols"] * tp == want["o_proj_cols"]
            assert got["kv_cache_shapes"] == want["kv_cache_shapes"], where
            assert got["kv_bytes_per_token"] == want["kv_bytes_per_token"], where


def test_tp2_equals_tp1(tp1):
    runs = [(name, s) for name in CHECKPOINTS for s in SCENARIOS]
    per_rank = run_ranks(_spmd, 2, [(tp1[name][0], s) for name, s in runs], timeout_s=300)
    _assert_equal_to_tp1(tp1, runs, per_rank, 2)


def test_tp4_expert_parallel_equals_tp1(tp1):
    """One head per rank, and whole experts per rank (V2-Lite's 8 experts two to a rank,
    V3's 16 four to a rank); the shared experts' intermediate dimension split in four
    (V3's 40 into 10, across its 16-wide fp8 blocks)."""
    runs = [("v2-lite-yarn", "chunked"), ("v3-qlora-fp8", "batch")]
    per_rank = run_ranks(_spmd, 4, [(tp1[name][0], s) for name, s in runs], expert_parallel=True, timeout_s=400)
    _assert_equal_to_tp1(tp1, runs, per_rank, 4)


def test_engine_tp2_equals_tp1(tp1):
    """The engine's own tensor parallelism (a spawned worker for rank 1, steps broadcast
    from rank 0): chunked prefill of the V3 shape (q_lora, fp8) as at TP=1."""
    got = _generate(tp1["v3-qlora-fp8"][0], "chunked", tensor_parallel_size=2)
    _assert_equal_to_tp1(tp1, [("v3-qlora-fp8", "chunked")], [[got]], 2)


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
