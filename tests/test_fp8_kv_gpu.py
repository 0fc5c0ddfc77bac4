"""GPU-only: an fp8 KV cache with checkpoint k / v scales under CUDA graphs (graph = eager, no
host sync in the hot path: the scales are device buffers the kernels load), with prefix
caching (hits read the scaled fp8 blocks) and n-gram speculation (docs/fp8_kv_cache.md)."""
from __future__ import annotations

import pytest
import torch
from checkpoint_surgery import edit_tensors
from helpers import step_without_host_sync

from core_runner import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SCALES = {0: (2.0, 0.5), 1: (1.5, 3.0)}


@pytest.fixture(scope="module")
def scaled_ckpt(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("gpu_fp8kv")
    cfg = transformers.Qwen3Config(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(root / "plain")

    def edit(t):
        for i, (ks, vs) in SCALES.items():
            t[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(ks)
            t[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(vs)
    return str(edit_tensors(root / "plain", root / "scaled", edit))


def _prompts(n, lo=1, hi=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, 1000, (k,), generator=g).tolist() for k in lens]


def _engine(path, **kw):
    opts = dict(device="cuda", dtype="bfloat16", max_model_len=256, max_num_seqs=16, block_size=16,
                num_kv_blocks=128, max_num_batched_tokens=64, kv_cache_dtype="fp8")
    opts.update(kw)
    return LLM(path, **opts)


def _scales(llm):
    return [tuple(m.kv_scale.tolist()) for m in llm.engine.model.modules() if getattr(m, "kv_scale_loaded", ())]


def test_fp8_cache_with_scales_graph_equals_eager(scaled_ckpt):
    prompts = _prompts(9, seed=3)
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    eager = _engine(scaled_ckpt, enforce_eager=True)
    graph = _engine(scaled_ckpt)
    assert _scales(graph) == [SCALES[0], SCALES[1]] and graph.engine.plan.cuda_graphs
    assert all(t.dtype == torch.float8_e4m3fn for t in graph.engine.debug.paged_caches().values())
    want = [o.token_ids for o in eager.generate(prompts, sp)]
    got = [o.token_ids for o in graph.generate(prompts, sp)]
    assert got == want and sum(graph.engine.runner.graphs.replays.values()) > 0


def test_fp8_cache_with_scales_has_no_host_sync(scaled_ckpt):
    eng = _engine(scaled_ckpt).engine
    for i, p in enumerate(_prompts(8, hi=90, seed=1)):
        eng.add_request(p, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True), req_id=str(i))
    steps, done = step_without_host_sync(eng)
    assert done == 8 and steps >= 20


def test_fp8_cache_with_scales_prefix_hits_and_ngram_under_graphs(scaled_ckpt):
    base = _prompts(1, lo=40, hi=40, seed=9)[0]
    prompt = (base[:12] * 4)[:48]  # repeats: the n-gram proposer finds matches
    sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    f32 = dict(dtype="float32")  # fewer near-ties than bf16 for exact token equality across batch shapes
    want = _engine(scaled_ckpt, enable_prefix_caching=False, **f32).generate([prompt], sp)[0].token_ids
    cached = _engine(scaled_ckpt, **f32)
    first = cached.generate([prompt], sp)[0].token_ids
    again = cached.generate([prompt], sp)[0].token_ids
    assert cached.engine.scheduler.prefix_cache_hits > 0 and first == again == want
    spec = _engine(scaled_ckpt, enable_prefix_caching=False, **f32,
                   speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                       "prompt_lookup_max": 3})
    assert spec.generate([prompt], sp)[0].token_ids == want
