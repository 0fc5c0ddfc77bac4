"""gpt-oss through the runner's Triton path (interpreter on the CPU, compiled on a GPU):
paged attention with sinks and an 8-token window, RoPE, RMSNorm and the fused MoE with
expert biases and the clamped SwiGLU together give transformers' logits under chunked
prefill and decode."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM

pytest.importorskip("core_runner_gpt_oss", reason="pip install -e plugins/gpt_oss (requirements-dev)")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers

    from core_runner.conformance.reference import randomize_every_tensor

    path = tmp_path_factory.mktemp("gpt_oss_triton")
    cfg = transformers.GptOssConfig(
        vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128, initializer_range=0.15,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 16, "rope_theta": 150000.0},
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(cfg).float().eval()
    randomize_every_tensor(model, torch.Generator().manual_seed(1))
    model.save_pretrained(path)
    return str(path), model


def test_triton_runner_matches_transformers(ckpt, device):
    from helpers import Recorder, greedy, run

    path, hf = ckpt
    llm = LLM(path, device=device, dtype="float32", kernels="triton" if device == "cpu" else None,
              max_model_len=48, max_num_seqs=2, block_size=4, num_kv_blocks=24, max_num_batched_tokens=8)
    assert llm.engine.plan.kernels == "triton" and llm.engine.plan.attention_backend == "triton"
    rec = Recorder(llm.engine)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (21, 5)]
    outs = run(llm.engine, [(f"r{i}", p, greedy(4)) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        out = list(outs[f"r{i}"].token_ids)
        ids = torch.tensor([p + out[:-1]])
        with torch.no_grad():
            ref = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        assert out == ref[len(p) - 1:].argmax(dim=-1).tolist()
        for pos, lg in rec.logits_of(f"r{i}"):
            err = (lg.cpu() - ref[pos]).abs().max().item()
            assert err < 1e-4, f"r{i} position {pos}: logits differ from transformers by {err:.3g}"
