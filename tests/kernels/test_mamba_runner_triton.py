"""The GraniteMoeHybrid plugin on the runner's Triton path end to end (interpreter on
the CPU, compiled on a GPU): Mamba conv / scan kernels, paged attention, input prep and
sampler together give transformers' greedy tokens under chunked prefill, preemption and
async scheduling. On a GPU, CUDA-graph replay must also equal eager."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, SamplingParams

CFG = dict(
    vocab_size=200, hidden_size=32, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, mamba_n_heads=4, mamba_d_head=16,
    mamba_d_state=8, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4,
    shared_intermediate_size=48, num_local_experts=0, position_embedding_type="rope",
    embedding_multiplier=2.0, attention_multiplier=0.25, residual_multiplier=0.7, logits_scaling=1.5,
    initializer_range=0.2, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers

    path = tmp_path_factory.mktemp("granite_triton_path")
    torch.manual_seed(0)
    model = transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(**CFG)).eval()
    model.save_pretrained(path)
    return str(path), model


def _reference(hf, prompts, n):
    out = []
    for p in prompts:
        ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(ref[0, len(p):].tolist())
    return out


def test_triton_mamba_runner_matches_transformers(ckpt, device):
    path, hf = ckpt
    llm = LLM(path, device=device, dtype="float32", kernels="triton" if device == "cpu" else None,
              max_model_len=24, max_num_seqs=3, block_size=4, num_kv_blocks=6, max_num_batched_tokens=8,
              async_scheduling=True)
    assert llm.engine.plan.kernels == "triton" and llm.engine.plan.attention_backend == "triton"
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (1, 6, 13)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    for o, ref in zip(outs, _reference(hf, prompts, 4)):
        assert o.token_ids == ref
    assert llm.engine.scheduler.num_preemptions > 0


def test_triton_mamba_speculation_matches_transformers(ckpt, device):
    """n-gram speculation on the Triton path (per-position states in the sequential scan,
    rolled back after acceptance; verification steps eager) gives transformers' greedy
    tokens, with proposals both accepted and rejected."""
    path, hf = ckpt
    llm = LLM(path, device=device, dtype="float32", kernels="triton" if device == "cpu" else None,
              max_model_len=32, max_num_seqs=2, block_size=4, num_kv_blocks=16,
              speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 2})
    g = torch.Generator().manual_seed(5)
    # the model's own greedy text as the prompt: its continuation repeats tokens seen
    # earlier (161, 84; 4, 158 for this seed), so lookups match and steps verify
    starts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (2, 3)]
    prompts = [p + ref for p, ref in zip(starts, _reference(hf, starts, 18))]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for o, ref in zip(outs, _reference(hf, prompts, 8)):
        assert o.token_ids == ref
    sch = llm.engine.scheduler
    assert sch.spec_num_draft_tokens > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_equals_eager(ckpt):
    path, _ = ckpt
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (3, 17, 40, 8, 25)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    results = {}
    for eager in (True, False):
        llm = LLM(path, device="cuda", dtype="float32", enforce_eager=eager, max_model_len=96, max_num_seqs=8,
                  block_size=16, max_num_batched_tokens=64)
        assert llm.engine.plan.cuda_graphs == (not eager)
        results[eager] = [o.token_ids for o in llm.generate(prompts, params)]
        if not eager:
            assert sum(llm.engine.runner.graphs.replays.values()) > 0
    assert results[True] == results[False]
