"""The Llama template plugin under tensor parallelism: ``LLM(..., tensor_parallel_size=N)``
(the engine's worker ranks, gloo on the CPU) at N = 2 and 4 generates the same greedy
tokens as one rank, with the same schedule and logits within 1e-4 at every step, in
one-step and chunked prefill, for grouped-query attention (2 KV heads: replicated at
N = 4) and for one KV head with biases and tied embeddings (replicated at both sizes).
"""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, SamplingParams

# 250 = 2 * 125 but not a multiple of 4: at TP=4 the last vocabulary block is padded
VOCAB = 250
BASE = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
    # wide enough that greedy continuations have clear argmax gaps (see tests/helpers.py)
    initializer_range=0.15, eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
CHECKPOINTS = {
    "gqa": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "mqa-bias-tied": dict(num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
}
LENGTHS = [1, 6, 13, 29]
MODES = {"one_step": 256, "chunked": 7}  # max_num_batched_tokens
NEW_TOKENS = 5
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, single_torch_thread):
    import transformers

    root = tmp_path_factory.mktemp("tp_llama")
    out = {}
    for seed, (name, spec) in enumerate(CHECKPOINTS.items()):
        torch.manual_seed(seed)
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BASE, **spec)).float().eval()
        hf.save_pretrained(str(root / name))
        out[name] = (str(root / name), hf)
    return out


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(9)
    out = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]
    out[-1][0] = VOCAB - 1  # an id of the last rank's (padded, at TP=4) block
    return out


def generate(path: str, prompts: list[list[int]], budget: int, tp: int = 1) -> dict:
    """Greedy tokens per prompt, per step {req_id: (scheduled tokens, logits)} as the
    engine recorded them, and the driver's (rank 0's) share of the first layer."""
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=64, block_size=4, max_num_seqs=len(prompts),
              max_num_batched_tokens=budget, num_kv_blocks=len(prompts) * 16, tensor_parallel_size=tp)
    try:
        steps = llm.engine.debug.record_steps()
        outs = llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True),
                            use_tqdm=False)
        model = llm.engine.model
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        shapes = {
            "heads": (attn.num_heads, attn.num_kv_heads), "qkv": tuple(attn.qkv_proj.weight.shape),
            "o_proj": tuple(attn.o_proj.weight.shape), "gate_up": tuple(mlp.gate_up_proj.weight.shape),
            "down": tuple(mlp.down_proj.weight.shape), "embed": tuple(model.model.embed_tokens.weight.shape),
            "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        }
    finally:
        llm.engine.shutdown()
    return {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "steps": [{r: (s.num_scheduled[r], s.logits[r]) for r in s.req_ids if r in s.logits} for s in steps],
        "shapes": shapes,
    }


def expected_shapes(name: str, tp: int) -> dict:
    kv = CHECKPOINTS[name]["num_key_value_heads"]
    local_kv = max(kv // tp, 1)  # more ranks than KV heads: one, replicated
    return {
        "heads": (4 // tp, local_kv), "qkv": ((4 // tp + 2 * local_kv) * 16, 64), "o_proj": (64, 64 // tp),
        "gate_up": (2 * 128 // tp, 64), "down": (64, 128 // tp), "embed": (-(-VOCAB // tp), 64),
        "tied": CHECKPOINTS[name]["tie_word_embeddings"],
    }


@pytest.fixture(scope="module")
def ref(checkpoints, prompts):
    """TP=1 runs of every checkpoint and mode; the baseline itself agrees with transformers."""
    out = {name: {mode: generate(path, prompts, budget) for mode, budget in MODES.items()}
           for name, (path, _) in checkpoints.items()}
    for name, (_, hf) in checkpoints.items():
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([prompts[-1]])).logits[0, -1]
        got = out[name]["one_step"]["steps"][0]["3"][1]
        assert (got - want).abs().max().item() <= LOGIT_ATOL, name
    chunked = out["gqa"]["chunked"]["steps"]
    assert any(0 < n < LENGTHS[int(r)] for s in chunked[:3] for r, (n, _) in s.items()), "no prompt was chunked"
    return out


@pytest.mark.parametrize("tp", [2, 4])
def test_template_tp_matches_tp1(checkpoints, prompts, ref, tp):
    for name, (path, _) in checkpoints.items():
        for mode, budget in MODES.items():
            got, want, what = generate(path, prompts, budget, tp), ref[name][mode], f"tp={tp} {name} {mode}"
            assert got["shapes"] == expected_shapes(name, tp), what
            assert got["tokens"] == want["tokens"], what
            assert len(got["steps"]) == len(want["steps"]), what
            for i, (g, w) in enumerate(zip(got["steps"], want["steps"])):
                assert g.keys() == w.keys(), f"{what} step {i}"
                for r in w:
                    assert g[r][0] == w[r][0], f"{what} step {i} request {r}: scheduled tokens"
                    err = (g[r][1] - w[r][1]).abs().max().item()
                    assert err <= LOGIT_ATOL, f"{what} step {i} request {r}: logits differ by {err:.3g}"
