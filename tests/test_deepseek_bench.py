"""The DeepSeek-V2-Lite bench checkpoint's config is the published one (YaRN, 163,840
positions, full sizes), and the same config cut to CPU sizes generates through the engine
what transformers generates, with the rotary layers given the YaRN settings."""
from __future__ import annotations

import torch
from helpers import Checkpoint, greedy, hf_greedy, make_engine, random_prompts, run

PUBLISHED_SIZES = dict(
    vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
    num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
    first_k_dense_replace=1, max_position_embeddings=163840,
)
PUBLISHED_YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                  "original_max_position_embeddings": 4096, "rope_type": "yarn"}


def _rope(cfg) -> dict:
    from core_runner.layers.rope_config import rope_parameters_of

    return {k: v for k, v in rope_parameters_of(cfg).items() if k in PUBLISHED_YARN}


def test_bench_config_is_the_published_one():
    from core_runner_deepseek.bench import v2_lite_config
    from core_runner_deepseek.examples import DEEPSEEK_V2_LITE_PUBLISHED

    cfg = v2_lite_config()
    assert {k: getattr(cfg, k) for k in PUBLISHED_SIZES} == PUBLISHED_SIZES
    assert (cfg.topk_method, cfg.routed_scaling_factor, cfg.norm_topk_prob) == ("greedy", 1.0, False)
    assert _rope(cfg) == PUBLISHED_YARN
    assert v2_lite_config(num_hidden_layers=2).num_hidden_layers == 2
    # building a config must not write into the published dict
    assert "rope_type" not in DEEPSEEK_V2_LITE_PUBLISHED["rope_scaling"]


def test_bench_config_cut_to_cpu_sizes_matches_transformers(tmp_path, monkeypatch, single_torch_thread):
    import core_runner_deepseek.model as ds_model
    from core_runner_deepseek.bench import v2_lite_config
    from core_runner_deepseek.examples import V2_LITE_CPU_SIZES
    from transformers import DeepseekV2ForCausalLM

    # a wider init than the published 0.02, so that greedy tokens have no near-ties
    cfg = v2_lite_config(**V2_LITE_CPU_SIZES, initializer_range=0.12)
    torch.manual_seed(0)
    hf = DeepseekV2ForCausalLM(cfg).to(torch.float32).eval()
    hf.save_pretrained(str(tmp_path))
    ckpt = Checkpoint(name="v2-lite-bench-cut", path=str(tmp_path), hf=hf, vocab=cfg.vocab_size)

    seen = []
    real_get_rope = ds_model.get_rope

    def spy(config, *args, **kwargs):
        seen.append(_rope(config))
        return real_get_rope(config, *args, **kwargs)

    monkeypatch.setattr(ds_model, "get_rope", spy)
    engine = make_engine(ckpt)
    assert seen and all(r == PUBLISHED_YARN for r in seen), seen
    prompts = random_prompts([5, 23], seed=3, vocab=cfg.vocab_size)
    outs = run(engine, [(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, 8), f"r{i}"
