"""Speculative decoding on the GPU: lossless against the same engine without it, no host
sync in a verifying step (n-gram and draft model, async scheduling one step ahead, CUDA
graphs, Triton kernels), and the draft's decode passes replayed from CUDA graphs equal
to eager ones."""
from __future__ import annotations

import pytest
import torch
from helpers import step_without_host_sync
from spec_draft_fixture import plugins_with_draft, write_copying_pair, write_draft

from core_runner import SamplingParams
from core_runner.config import EngineConfig
from core_runner.engine.llm_engine import LLMEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CFG = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
           rms_norm_eps=1e-6, eos_token_id=None, bos_token_id=None, pad_token_id=None)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("spec_gpu")
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**CFG)).eval().save_pretrained(str(root / "target"))
    flat, copy = write_copying_pair(root, CFG)
    return {"target": str(root / "target"), "draft": write_draft(root / "draft", CFG, scale=0.05),
            "flat": flat, "copy": copy, "pm": plugins_with_draft()}


def engine(paths, model: str, spec: dict | None = None, **kw) -> LLMEngine:
    opts = dict(model=model, device="cuda", dtype="float32", max_model_len=256, max_num_seqs=32, block_size=16,
                num_kv_blocks=256, max_num_batched_tokens=64, speculative_config=spec)
    opts.update(kw)
    return LLMEngine(EngineConfig(**opts), paths["pm"])


def prompts(n: int, seed: int, repeat: bool = False) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = torch.randint(3, 1000, (int(torch.randint(4, 60, (1,), generator=g)),), generator=g).tolist()
        out.append(p * 3 if repeat else p)  # repeated text: n-gram proposals find matches
    return out


def generate(eng: LLMEngine, ps: list[list[int]], params) -> list[list[int]]:
    plist = params if isinstance(params, list) else [params] * len(ps)
    for i, (p, sp) in enumerate(zip(ps, plist)):
        eng.add_request(p, sp, req_id=str(i))
    done = {}
    for _ in range(5000):
        for o in eng.step():
            if o.finished:
                done[o.request_id] = list(o.outputs[0].token_ids)
        if not eng.has_unfinished_requests():
            break
    return [done[str(i)] for i in range(len(ps))]


SPECS = {
    "ngram": ("target", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}),
    "random-draft": ("target", {"method": "eagle", "num_speculative_tokens": 3}),
    "copying-draft": ("flat", {"method": "eagle", "num_speculative_tokens": 3}),
}


def spec_of(paths, name: str) -> tuple[str, dict]:
    model, spec = SPECS[name]
    spec = dict(spec)
    if spec["method"] == "eagle":
        spec["model"] = paths["copy" if name == "copying-draft" else "draft"]
    return paths[model], spec


@pytest.mark.parametrize("name", list(SPECS))
def test_lossless_and_graph_equals_eager(paths, name):
    model, spec = spec_of(paths, name)
    ps = prompts(12, seed=1, repeat=True)
    greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    seeded = [SamplingParams(max_tokens=32, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True) for i in range(12)]
    want = generate(engine(paths, model), ps, greedy)
    eng = engine(paths, model, spec)
    assert eng.plan.async_scheduling and eng.plan.cuda_graphs and eng.plan.attention_backend == "triton"
    assert generate(eng, ps, greedy) == want
    sch = eng.scheduler
    drafted, accepted = sch.spec_num_draft_tokens, sch.spec_num_accepted_tokens
    assert drafted > 0
    if name == "copying-draft":  # greedy proposals of a draft that copies the target: kept
        assert accepted >= 0.9 * drafted, (accepted, drafted)
    assert generate(eng, ps, seeded) == generate(engine(paths, model), ps, seeded)
    eager = engine(paths, model, spec, enforce_eager=True)
    assert generate(eager, ps, greedy) == want
    if eng.runner.drafter is not None:
        assert eng.runner.drafter.num_replays > 0


@pytest.mark.parametrize("name", list(SPECS))
def test_no_host_sync_in_speculative_steps(paths, name):
    """Every step runs under set_sync_debug_mode("error"), with the next step scheduled
    while the previous one is in flight, as EngineCore does."""
    model, spec = spec_of(paths, name)
    eng = engine(paths, model, spec, max_num_batched_tokens=48)
    for i, p in enumerate(prompts(24, seed=2, repeat=True)):
        eng.add_request(p, SamplingParams(max_tokens=40, temperature=0.7 if i % 2 else 0.0, top_p=0.9, seed=i,
                                          ignore_eos=True), req_id=str(i))
    verifying = 0

    def watch(out, in_flight):
        nonlocal verifying
        verifying += bool(out.spec_token_counts) and in_flight

    step_without_host_sync(eng, watch, max_steps=3000)
    assert verifying >= 10, verifying  # verification steps planned while the previous step was in flight


def test_eagle3_target_aux_states_under_cuda_graphs(tmp_path):
    """A target serving an EAGLE-3 draft returns (hidden, aux states) from its captured
    graphs: graphs + async equal eager and the engine without speculation."""
    import transformers
    from eagle_fixtures import write_eagle3
    from helpers import TINY

    torch.manual_seed(0)
    cfg = {**TINY, "tie_word_embeddings": False}
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**cfg)).eval().save_pretrained(str(tmp_path / "t"))
    draft = write_eagle3(tmp_path / "d", cfg["vocab_size"], draft_vocab=64, seed=22, layer_ids=[0, 1, 1])
    spec = {"method": "eagle3", "num_speculative_tokens": 3, "model": draft}
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(3, 256, (int(n),), generator=g).tolist() for n in torch.randint(4, 40, (10,), generator=g)]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    opts = dict(model=str(tmp_path / "t"), device="cuda", dtype="float32", max_model_len=128, max_num_seqs=16,
                block_size=16, num_kv_blocks=128, max_num_batched_tokens=64)
    want = generate(LLMEngine(EngineConfig(**opts), plugins_with_draft()), ps, greedy)
    eng = LLMEngine(EngineConfig(**opts, speculative_config=spec), plugins_with_draft())
    assert eng.plan.cuda_graphs and eng.plan.async_scheduling
    assert generate(eng, ps, greedy) == want
    assert sum(eng.runner.graphs.replays.values()) > 0 and eng.runner.drafter.num_replays > 0
    eager = LLMEngine(EngineConfig(**opts, speculative_config=spec, enforce_eager=True), plugins_with_draft())
    assert generate(eager, ps, greedy) == want
    assert eng.scheduler.spec_num_draft_tokens > 0
