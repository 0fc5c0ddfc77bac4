"""Granite 3.x: GraniteForCausalLM (dense) and GraniteMoeForCausalLM (granite_hybrid plugin,
``model_dense`` / ``model_moe``) against transformers (CPU, float32, tiny random configs).

Every multiplier is moved off 1 (embedding, attention scale, residual, logits), every
parameter is jittered off its init (biases and norm weights included), so a model that
drops any of them differs. Three checkpoints: dense untied with attention and MLP
biases, dense tied (one KV head, a partial_rotary_factor that the reference ignores), MoE
(top-2 of 4 experts, untied). Prompts end mid-block and, with a
5-token step budget, mid-chunk; references are one prompt at a time, full forwards.
"""
from __future__ import annotations

import json
from pathlib import Path

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
    vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=5000.0,
    embedding_multiplier=4.0, attention_multiplier=0.11, residual_multiplier=0.6, logits_scaling=3.0,
    initializer_range=0.2, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
SPECS = {  # name: (transformers class, config extras, seed)
    "dense-bias-untied": ("Granite", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False), 0),
    # a smaller embedding multiplier: with a tied head a large one makes every token predict itself;
    # Granite's default RoPE rotates the whole head whatever partial_rotary_factor says
    "dense-tied": ("Granite", dict(tie_word_embeddings=True, num_key_value_heads=1, embedding_multiplier=1.5,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                                                    "partial_rotary_factor": 0.5}), 1),
    "moe-untied": ("GraniteMoe", dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                                      tie_word_embeddings=False), 2),
}


def _build(root: Path, name: str) -> Checkpoint:
    import transformers

    kind, extra, seed = SPECS[name]
    fields = {**BASE, **extra}
    if "rope_parameters" in extra:
        fields.pop("rope_theta")
    cfg = getattr(transformers, f"{kind}Config")(**fields)
    torch.manual_seed(seed)
    hf = getattr(transformers, f"{kind}ForCausalLM")(cfg).to(torch.float32).eval()
    with torch.no_grad():  # zero biases and unit norms would hide a model that ignores them
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(str(root / name))
    return Checkpoint(name=name, path=str(root / name), hf=hf)


@pytest.fixture(scope="module")
def granite3(tmp_path_factory, single_torch_thread):
    root = tmp_path_factory.mktemp("granite3_tiny")
    return {name: _build(root, name) for name in SPECS}


@pytest.mark.parametrize("budget", [None, 5])
@pytest.mark.parametrize("name", list(SPECS))
def test_logits_match_hf(granite3, name, budget):
    """Greedy tokens and every logits row (chunk ends, prefills, decodes) equal the reference."""
    ckpt = granite3[name]
    opts = {} if budget is None else {"max_num_batched_tokens": budget}
    engine = make_engine(ckpt, max_model_len=64, max_num_seqs=4, **opts)
    rec = Recorder(engine)
    prompts = random_prompts([1, 6, 13, 22], seed=3)
    outs = run(engine, [(f"r{i}", p, greedy(6)) for i, p in enumerate(prompts)])
    if budget is not None:
        assert max(s.num_tokens for s in rec.steps) <= budget
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= len(prompts) * 6
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, 6), f"r{i} (len {len(p)})"


def test_continuations_are_informative(granite3):
    """The references are not degenerate (a constant continuation would hide position bugs)."""
    for ckpt in granite3.values():
        toks = hf_greedy(ckpt, random_prompts([13], seed=3)[0], 6)
        assert len(set(toks)) > 1, ckpt.name


def test_moe_in_memory_names_load(granite3, tmp_path):
    """A checkpoint with transformers' in-memory MoE names (experts.gate_up_proj / down_proj,
    router.weight) instead of the stored ones (input_linear / output_linear / router.layer)
    loads to the same model."""
    from safetensors.torch import load_file, save_file

    ckpt = granite3["moe-untied"]
    src = Path(ckpt.path)
    names = {"input_linear.weight": "experts.gate_up_proj", "output_linear.weight": "experts.down_proj",
             "router.layer.weight": "router.weight"}
    tensors = {}
    for k, v in load_file(str(src / "model.safetensors")).items():
        for old, new in names.items():
            k = k.replace(f"block_sparse_moe.{old}", f"block_sparse_moe.{new}")
        tensors[k] = v
    assert any(k.endswith("experts.gate_up_proj") for k in tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    renamed = Checkpoint(name="moe-renamed", path=str(tmp_path), hf=ckpt.hf)
    prompt = random_prompts([9], seed=4)[0]
    outs = run(make_engine(renamed, max_model_len=32, max_num_seqs=1), [("r", prompt, greedy(4))])
    assert outs["r"].token_ids == hf_greedy(ckpt, prompt, 4)


def test_unimplemented_activation_is_refused_by_name(granite3, tmp_path):
    from core_runner.oracle import UnsupportedError

    src = Path(granite3["dense-tied"].path)
    cfg = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    with pytest.raises(UnsupportedError, match=r"hidden_act='gelu' is not implemented by GraniteForCausalLM"):
        make_engine(Checkpoint(name="gelu", path=str(tmp_path), hf=None), max_model_len=32, max_num_seqs=1)


def test_moe_expert_parallel_equals_one_rank(granite3):
    """Two ranks holding two whole experts each (enable_expert_parallel; CR-TP-01 covers the
    intermediate split) give the one-rank engine's greedy tokens and logits, chunked."""
    ckpt = granite3["moe-untied"]
    prompts = random_prompts([5, 19], seed=8)
    got = []
    for opts in ({}, {"tensor_parallel_size": 2, "enable_expert_parallel": True}):
        engine = make_engine(ckpt, max_model_len=48, max_num_seqs=2, max_num_batched_tokens=8, **opts)
        try:
            rec = Recorder(engine)
            outs = run(engine, [(f"r{i}", p, greedy(5)) for i, p in enumerate(prompts)])
            got.append(({r: list(o.token_ids) for r, o in outs.items()}, {r: dict(rec.logits_of(r)) for r in outs}))
        finally:
            engine.shutdown()
    (tokens1, logits1), (tokens2, logits2) = got
    assert tokens2 == tokens1
    for req, by_pos in logits1.items():
        assert logits2[req].keys() == by_pos.keys()
        for pos, want in by_pos.items():
            assert (logits2[req][pos] - want).abs().max().item() <= 1e-4, (req, pos)
