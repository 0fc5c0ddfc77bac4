"""DeepSeek-V2/V3 (MLA latent cache + MoE) against transformers on tiny random checkpoints.

Configs: V2 greedy routing with q_lora, V2 group-limited greedy without q_lora (direct
q_proj), V3 with a randomised e_score_correction_bias (interleaved rope), and V3 with
rope_interleave=False, no q_lora and no renormalisation. Logits of every step (prefill
chunk ends and decodes) are within 1e-4 of HF full forwards; greedy tokens equal HF's
under chunked prefill, preemption and different batch compositions.
"""
from __future__ import annotations

import pytest
import torch
from helpers import (
    Checkpoint,
    Recorder,
    assert_logits_match_hf,
    greedy,
    hf_greedy,
    make_engine,
    random_prompts,
    run,
)

BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=24, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
    first_k_dense_replace=1, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.12,
    tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
CONFIGS = {
    "v2-greedy-qlora": ("V2", dict(topk_method="greedy", routed_scaling_factor=1.0), 0),
    "v2-group-limited-noqlora": ("V2", dict(topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                            q_lora_rank=None, routed_scaling_factor=1.5, n_shared_experts=2), 1),
    "v3-bias": ("V3", dict(n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5), 2),
    "v3-halfrope-noqlora": ("V3", dict(n_group=2, topk_group=1, norm_topk_prob=False, rope_interleave=False,
                                       q_lora_rank=None, routed_scaling_factor=1.0, first_k_dense_replace=0,
                                       num_experts_per_tok=3), 3),
}


def build_deepseek(root, name: str) -> Checkpoint:
    import transformers

    version, extra, seed = CONFIGS[name]
    cfg_cls = getattr(transformers, f"Deepseek{version}Config")
    model_cls = getattr(transformers, f"Deepseek{version}ForCausalLM")
    cfg = cfg_cls(**{**BASE, **extra})
    torch.manual_seed(seed)
    hf = model_cls(cfg).to(torch.float32).eval()
    if version == "V3":  # a random correction bias changes which experts are chosen
        for layer in hf.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.copy_(torch.randn_like(gate.e_score_correction_bias) * 0.3)
    path = root / name
    hf.save_pretrained(str(path))
    return Checkpoint(name=name, path=str(path), hf=hf)


@pytest.fixture(scope="module")
def deepseek_ckpts(tmp_path_factory, single_torch_thread):
    root = tmp_path_factory.mktemp("deepseek_tiny")
    return {name: build_deepseek(root, name) for name in CONFIGS}


@pytest.fixture(scope="module", params=list(CONFIGS))
def ds(request, deepseek_ckpts):
    return deepseek_ckpts[request.param]


PROMPT_LENS = [1, 6, 19, 40]


def test_logits_match_hf(ds):
    engine = make_engine(ds)
    rec = Recorder(engine)
    prompts = random_prompts(PROMPT_LENS, seed=11)
    outs = run(engine, [(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)])
    assert assert_logits_match_hf(ds, rec, outs, atol=1e-4) >= len(prompts) * 8
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ds, p, 8)


@pytest.mark.parametrize("scenario", ["chunked", "preempt", "one-by-one"])
def test_greedy_tokens_any_schedule(deepseek_ckpts, scenario):
    ckpt = deepseek_ckpts["v3-bias" if scenario != "chunked" else "v2-group-limited-noqlora"]
    prompts = random_prompts([3, 14, 27, 33, 9], seed=5)
    if scenario == "chunked":
        engine = make_engine(ckpt, max_num_batched_tokens=8, max_model_len=64)
    elif scenario == "preempt":
        engine = make_engine(ckpt, max_model_len=64, num_kv_blocks=24, max_num_seqs=5)
    else:
        engine = make_engine(ckpt, max_num_seqs=1)
    rec = Recorder(engine)
    outs = run(engine, [(f"r{i}", p, greedy(10)) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, 10), f"r{i} ({scenario})"
    assert_logits_match_hf(ckpt, rec, outs, atol=1e-4)
    if scenario == "preempt":
        assert engine.scheduler.num_preemptions > 0
    if scenario == "chunked":
        assert any(0 < s.num_scheduled[r] < len(prompts[int(r[1:])]) for s in rec.steps for r in s.num_scheduled
                   if s.num_computed[r] < len(prompts[int(r[1:])]))


def test_kv_memory_per_token_is_latent(deepseek_ckpts):
    ckpt = deepseek_ckpts["v2-greedy-qlora"]
    engine = make_engine(ckpt)
    cfg = ckpt.hf.config
    per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * cfg.num_hidden_layers * 4
    assert engine.memory_report()["kv_bytes_per_token"] == per_token
    # not per head: a naive K/V cache would hold heads * (qk_head_dim + v_head_dim) per token and layer
    assert per_token < cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
                                                  + cfg.v_head_dim) * cfg.num_hidden_layers * 4
    caches = engine.runner.kv_caches
    assert len(caches) == cfg.num_hidden_layers
    for cache in caches.values():
        assert tuple(cache.shape) == (1, engine.num_blocks, 4, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim)


def test_routing_matches_reference_modules(deepseek_ckpts):
    from core_runner.layers.moe_routing import grouped_topk_v2, grouped_topk_v3

    g = torch.Generator().manual_seed(0)
    for name in CONFIGS:
        hf = deepseek_ckpts[name].hf
        cfg = hf.config
        router = hf.model.layers[-1].mlp.gate
        x = torch.randn(64, cfg.hidden_size, generator=g)
        logits, w_ref, id_ref = router(x)
        if CONFIGS[name][0] == "V2":
            w, ids = grouped_topk_v2(logits, cfg.num_experts_per_tok, cfg.topk_method, cfg.n_group,
                                     cfg.topk_group, cfg.routed_scaling_factor)
        else:
            w, ids = grouped_topk_v3(logits, router.e_score_correction_bias, cfg.num_experts_per_tok, cfg.n_group,
                                     cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)
        o_ref, o = id_ref.sort(-1).indices, ids.long().sort(-1).indices
        assert torch.equal(id_ref.gather(1, o_ref), ids.long().gather(1, o)), name
        torch.testing.assert_close(w.gather(1, o), w_ref.float().gather(1, o_ref), rtol=1e-6, atol=1e-6)


def test_group_limited_routing_differs_from_greedy():
    """The group restriction matters: some tokens' best experts lie in excluded groups."""
    from core_runner.layers.moe_routing import grouped_topk_v2

    logits = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    _, a = grouped_topk_v2(logits, 2, "greedy")
    _, b = grouped_topk_v2(logits, 2, "group_limited_greedy", 4, 1)
    assert not torch.equal(a.sort(-1).values, b.sort(-1).values)
    assert ((b // 2)[:, 0] == (b // 2)[:, 1]).all()  # one group of 2 experts kept
    with pytest.raises(ValueError, match="topk_method"):
        grouped_topk_v2(logits, 2, "noaux_tc")


def test_fused_moe_layer_matches_reference_experts(deepseek_ckpts):
    """The loader routes per-expert HF tensors into the stacked weights; the torch path
    equals transformers' experts module."""
    from core_runner.layers.fused_moe import FusedMoE

    hf = deepseek_ckpts["v3-bias"].hf
    experts = hf.model.layers[-1].mlp.experts
    e, two_i, h = experts.gate_up_proj.shape
    moe = FusedMoE(e, h, two_i // 2)
    for i in range(e):
        gate, up = experts.gate_up_proj[i].chunk(2, dim=0)
        moe.w13.weight_loader(moe.w13.weight, gate, (i, "gate"))
        moe.w13.weight_loader(moe.w13.weight, up, (i, "up"))
        moe.w2.weight_loader(moe.w2.weight, experts.down_proj[i], (i, "down"))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(37, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:3] for _ in range(37)])
    w = torch.rand(37, 3, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(moe(x, w, ids), experts(x, ids, w), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="expert shard"):
        moe.w13.weight_loader(moe.w13.weight, gate, (e, "gate"))


def test_unsupported_rope_type_is_refused():
    import transformers
    from core_runner_deepseek.model import DeepseekV2ForCausalLM

    cfg = transformers.DeepseekV2Config(**{**BASE, "topk_method": "greedy"})
    cfg.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type='proportional' is not supported: expected one of"):
        DeepseekV2ForCausalLM(cfg)


def test_backend_without_mla_is_refused_at_construction(deepseek_ckpts):
    from core_runner.attention.backend import AttentionBackend
    from core_runner.attention.registry import register_backend, unregister_backend
    from core_runner.oracle import UnsupportedError

    class NoMLA(AttentionBackend):  # supports_mla=False by default
        name = "no_mla"

        def write_kv(self, kv_cache, k, v, md):
            pass

        def forward(self, q, kv_cache, md, scale):
            return q

    md = type("MD", (), {"causal": True})()
    with pytest.raises(NotImplementedError, match="'no_mla' declares supports_mla=False"):
        NoMLA().forward_mla(torch.zeros(1, 1, 4), torch.zeros(1, 1, 2), torch.zeros(1, 1, 1, 1, 6), md, 1.0)
    register_backend("no_mla", NoMLA)
    try:
        with pytest.raises(UnsupportedError, match=r"MLAAttention layer .*supports_mla=True.*'no_mla' declares "
                                                   r"supports_mla=False; use attention_backend='torch'"):
            make_engine(deepseek_ckpts["v2-greedy-qlora"], attention_backend="no_mla")
    finally:
        unregister_backend("no_mla")


def test_registered_with_capabilities():
    from core_runner.plugins import load_plugins

    pm = load_plugins(["deepseek"])
    assert pm.plugins["deepseek"]["architectures"] == ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"]
    for arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        reg = pm.registry.get(arch)
        assert reg.capability("chunked_prefill").supported and reg.capability("triton_attention").supported
        assert reg.capability("prefix_caching").state == "supported"
        assert reg.examples and reg.load_model_class().__name__ == arch


def test_registry_declares_deepseek():
    from pathlib import Path

    import tomllib

    table = tomllib.loads((Path(__file__).parents[1] / "registry.toml").read_text())["architectures"]
    for arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        entry = table[arch]
        assert entry["package"] == "core-runner-deepseek" and entry["plugin"] == "deepseek"
        assert entry["capabilities"]["prefix_caching"] == "supported"
        assert entry["capabilities"]["chunked_prefill"] == "supported"
