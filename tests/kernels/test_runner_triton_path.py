"""The runner's Triton path end to end (interpreter on the CPU, compiled on a GPU):
input prep, KV write, paged attention, Gumbel sampler and post-update kernels together
give transformers' greedy tokens under chunked prefill, preemption and async scheduling."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, SamplingParams


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers

    path = tmp_path_factory.mktemp("triton_path")
    cfg = transformers.Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.15,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return str(path), model


def test_triton_runner_matches_transformers(ckpt, device):
    path, hf = ckpt
    llm = LLM(path, device=device, dtype="float32", kernels="triton" if device == "cpu" else None,
              max_model_len=64, max_num_seqs=4, block_size=4, num_kv_blocks=16, max_num_batched_tokens=16,
              async_scheduling=True)
    assert llm.engine.plan.kernels == "triton" and llm.engine.plan.attention_backend == "triton"
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 13, 22, 35)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    for p, o in zip(prompts, outs):
        ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.token_ids == ref[0, len(p):].tolist()
    assert llm.engine.scheduler.num_preemptions > 0
