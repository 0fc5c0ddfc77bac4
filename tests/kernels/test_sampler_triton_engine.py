"""The engine's Triton sampling path (interpreter on the CPU, compiled on a GPU) samples
the same tokens as the torch path from the same model, with every stage on, and returns
the same logprobs and prompt logprobs."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, SamplingParams


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers

    path = tmp_path_factory.mktemp("sampler_triton")
    cfg = transformers.Qwen3Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128, initializer_range=0.15,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return str(path)


def test_triton_sampling_path_equals_torch_path(ckpt, device):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (7, 3)]
    params = [
        SamplingParams(max_tokens=4, temperature=0.8, top_k=30, top_p=0.8, min_p=0.05, seed=11, repetition_penalty=1.4,
                       frequency_penalty=0.5, presence_penalty=0.2, logit_bias={3: 2.0}, min_tokens=2,
                       stop_token_ids=[4], logprobs=2, prompt_logprobs=1, ignore_eos=True),
        SamplingParams(max_tokens=4, temperature=1.2, top_p=0.6, seed=12, logprobs=0, ignore_eos=True),
    ]
    opts = dict(dtype="float32", max_model_len=32, max_num_seqs=2, block_size=4, num_kv_blocks=16,
                max_num_batched_tokens=5)
    ref = LLM(ckpt, device="cpu", kernels="torch", **opts).generate(prompts, params)
    llm = LLM(ckpt, device=device, kernels="triton" if device == "cpu" else None, **opts)
    assert llm.engine.runner.sampler_triton
    got = llm.generate(prompts, params)
    for a, b in zip(got, ref):
        assert a.token_ids == b.token_ids
        la, lb = a.outputs[0].logprobs, b.outputs[0].logprobs
        for x, y in zip(la + (a.prompt_logprobs or [None])[1:], lb + (b.prompt_logprobs or [None])[1:]):
            assert x.keys() == y.keys() and all(abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)
            assert [v.rank for v in x.values()] == [v.rank for v in y.values()]
    assert len(got[0].prompt_logprobs) == 7
