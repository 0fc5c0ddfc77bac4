"""GptOssForCausalLM (gpt_oss plugin) against transformers, float32 on the CPU.

One checkpoint: an 8-token window on alternating layers, attention sinks, q/k/v/o biases,
YaRN over 32 original positions (so the prompts run past the scaled range), biased router
and experts with the clamped SwiGLU, every tensor moved off its init value (HF zeroes the
expert biases). Prompts several windows long run through chunked prefill (chunk ends
inside windows and blocks) and decode; every logits row must equal the reference's. Also:
expert parallelism equals one rank, and what is refused by name (MXFP4 checkpoints, a
layer kind other than sliding / full attention, a sliding layer without a window).
"""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from helpers import Checkpoint, Recorder, assert_logits_match_hf, greedy, hf_logits, make_engine, random_prompts, run

pytest.importorskip("core_runner_gpt_oss", reason="pip install -e plugins/gpt_oss (requirements-dev)")

CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=3, head_dim=16,
    num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    num_local_experts=8, num_experts_per_tok=3, max_position_embeddings=256, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 32, "rope_theta": 150000.0},
    initializer_range=0.15, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
PROMPT_LENS = (61, 26, 5, 40)  # 7.6, 3.3, 0.6 and 5 windows
NEW_TOKENS = 8
ENGINE = dict(max_model_len=96, max_num_seqs=4, block_size=4, max_num_batched_tokens=7)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, single_torch_thread) -> Checkpoint:
    import transformers

    from core_runner.conformance.reference import randomize_every_tensor, unchanged_tensors

    path = tmp_path_factory.mktemp("gpt_oss_tiny") / "gpt_oss"
    torch.manual_seed(0)
    hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(**CONFIG)).float().eval()
    randomize_every_tensor(hf, torch.Generator().manual_seed(1))
    assert not unchanged_tensors(hf)
    hf.save_pretrained(str(path))
    return Checkpoint(name="gpt_oss", path=str(path), hf=hf)


def test_logits_match_hf_over_windows_chunked_and_decoded(ckpt):
    engine = make_engine(ckpt, **ENGINE)
    rec = Recorder(engine)
    prompts = random_prompts(list(PROMPT_LENS), seed=3)
    outs = run(engine, [(f"r{i}", p, greedy(NEW_TOKENS)) for i, p in enumerate(prompts)])
    assert max(s.num_tokens for s in rec.steps) <= ENGINE["max_num_batched_tokens"] < max(PROMPT_LENS)
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= len(prompts) * NEW_TOKENS
    for i, p in enumerate(prompts):  # greedy = the reference's argmax on the same sequence
        out = list(outs[f"r{i}"].token_ids)
        ref = hf_logits(ckpt, p + out[:-1])[len(p) - 1:]
        assert out == ref.argmax(dim=-1).tolist(), f"r{i}"


def test_the_window_and_the_sinks_matter(ckpt):
    """The checkpoint exercises both: the reference with full attention, or without its
    sinks, gives other logits on a prompt longer than the window."""
    import transformers

    seq = random_prompts([30], seed=4)[0]
    base = hf_logits(ckpt, seq)
    for change in ({"layer_types": ["full_attention"] * 3}, "sinks"):
        hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(**{**CONFIG, **(
            change if isinstance(change, dict) else {})})).float().eval()
        hf.load_state_dict(ckpt.hf.state_dict())
        if change == "sinks":
            for layer in hf.model.layers:
                layer.self_attn.sinks.data.fill_(-1e4)
        ids = torch.tensor([seq])
        with torch.no_grad():
            other = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        assert (other - base).abs().max() > 1e-2, change


def test_expert_parallel_equals_one_rank(ckpt):
    from core_runner import LLM

    prompts = random_prompts([19, 33], seed=8)
    results = []
    for tp, ep in ((1, False), (2, True)):
        engine = LLM(ckpt.path, dtype="float32", device="cpu", tensor_parallel_size=tp, enable_expert_parallel=ep,
                     num_kv_blocks=64, enforce_eager=True, **ENGINE).engine
        try:
            rec = Recorder(engine)
            outs = run(engine, [(f"r{i}", p, greedy(4)) for i, p in enumerate(prompts)])
            results.append(({r: list(o.token_ids) for r, o in outs.items()},
                            {(r, pos): lg.clone() for r in outs for pos, lg in rec.logits_of(r)}))
        finally:
            engine.shutdown()
    (tok1, lg1), (tok2, lg2) = results
    assert tok1 == tok2 and lg1.keys() == lg2.keys()
    assert max((lg1[k] - lg2[k]).abs().max().item() for k in lg1) <= 1e-4


def test_mxfp4_checkpoint_is_refused_by_name(ckpt, tmp_path):
    from core_runner import LLM

    path = tmp_path / "mxfp4"
    shutil.copytree(ckpt.path, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"quant_method='mxfp4' is not supported by core-runner: .*MXFP4 MoE kernel"):
        LLM(str(path), dtype="float32", device="cpu", max_model_len=64)


@pytest.mark.parametrize("change,match", [
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, r"layer_types=.*chunked_attention"),
    ({"layer_types": ["sliding_attention"]}, r"layer_types=.*num_hidden_layers=3"),
    ({"sliding_window": None}, r"sliding_window=None"),
])
def test_configs_it_cannot_run_are_refused_by_name(change, match):
    from core_runner_gpt_oss.model import GptOssForCausalLM

    cfg = SimpleNamespace(**{**CONFIG, **change})
    with pytest.raises(ValueError, match=match):
        GptOssForCausalLM(cfg)
