"""DeepSeek-V3 through the runner's Triton path (interpreter on the CPU, compiled on a
GPU): latent-cache write, the MLA kernel and the fused-MoE grouped GEMM together give
transformers' greedy tokens under chunked prefill, preemption and async scheduling."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, SamplingParams


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers

    path = tmp_path_factory.mktemp("mla_triton_path")
    cfg = transformers.DeepseekV3Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=4, topk_group=2, first_k_dense_replace=1, max_position_embeddings=256, initializer_range=0.12,
        routed_scaling_factor=2.0, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    for layer in model.model.layers[1:]:
        layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.3)
    model.save_pretrained(path)
    return str(path), model


def test_deepseek_triton_runner_matches_transformers(ckpt, device):
    path, hf = ckpt
    llm = LLM(path, device=device, dtype="float32", kernels="triton" if device == "cpu" else None,
              max_model_len=32, max_num_seqs=3, block_size=4, num_kv_blocks=8, max_num_batched_tokens=16,
              async_scheduling=True)
    assert llm.engine.plan.kernels == "triton" and llm.engine.plan.attention_backend == "triton"
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 13, 22)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    for p, o in zip(prompts, outs):
        ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.token_ids == ref[0, len(p):].tolist()
    assert llm.engine.scheduler.num_preemptions > 0
