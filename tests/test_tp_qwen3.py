"""Qwen3ForCausalLM split over tensor-parallel ranks equals the model on one rank.

The same requests run through ``LLM(..., tensor_parallel_size=N)`` (gloo ranks on the
CPU) and through a one-rank LLM: greedy tokens must be equal, and each recorded logits
row (chunk ends and decodes, max_num_batched_tokens below the longest prompt) within
1e-4. Both tiny checkpoints have 4 query heads; the untied one has 2 KV heads, so at
TP=4 each KV head is replicated over two ranks, the tied one 4.
"""
from __future__ import annotations

import pytest
import torch
from helpers import random_prompts

BASE = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, initializer_range=0.15,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
SPECS = {
    "untied": dict(tie_word_embeddings=False, num_key_value_heads=2),
    "tied": dict(tie_word_embeddings=True, num_key_value_heads=4),
}
PROMPT_LENS = (5, 19, 33)
NEW_TOKENS = 6
ENGINE = dict(device="cpu", dtype="float32", max_model_len=64, max_num_seqs=4, block_size=4, num_kv_blocks=64,
              max_num_batched_tokens=16, enforce_eager=True)
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, single_torch_thread) -> dict[str, str]:
    import transformers

    root = tmp_path_factory.mktemp("qwen3_tp")
    paths = {}
    for seed, (name, spec) in enumerate(SPECS.items()):
        torch.manual_seed(seed)
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**BASE, **spec)).float().eval()
        hf.save_pretrained(str(root / name))
        paths[name] = str(root / name)
    return paths


def generate(path: str, tp: int = 1) -> dict:
    """Greedy tokens, every recorded logits row keyed by (request, position), the largest
    step, and the head counts / KV cache shape of each attention layer of rank 0."""
    from helpers import Recorder, greedy, run

    from core_runner import LLM
    from core_runner.layers import Attention

    engine = LLM(path, tensor_parallel_size=tp, **ENGINE).engine
    try:
        rec = Recorder(engine)
        prompts = random_prompts(list(PROMPT_LENS), seed=3)
        outs = run(engine, [(f"r{i}", p, greedy(NEW_TOKENS)) for i, p in enumerate(prompts)])
        attn = [m for m in engine.model.modules() if isinstance(m, Attention)]
        return {
            "tokens": {r: list(o.token_ids) for r, o in outs.items()},
            "logits": {(r, pos): lg.clone() for r in outs for pos, lg in rec.logits_of(r)},
            "max_step_tokens": max(s.num_tokens for s in rec.steps),
            "heads": [(a.num_heads, a.num_kv_heads, tuple(a.kv_cache.shape)) for a in attn],
        }
    finally:
        engine.shutdown()


def assert_equal_to_one_rank(one: dict, split: dict, what: str) -> None:
    assert split["tokens"] == one["tokens"], f"{what}: greedy tokens differ from TP=1"
    assert split["logits"].keys() == one["logits"].keys(), f"{what}: other (request, position) logits rows"
    for key, ref in one["logits"].items():
        err = (split["logits"][key] - ref).abs().max().item()
        assert err <= LOGIT_ATOL, f"{what}: logits of {key} differ from TP=1 by {err:.3g}"


@pytest.fixture(scope="module")
def one_rank(ckpts) -> dict[str, dict]:
    out = {name: generate(path) for name, path in ckpts.items()}
    for name, res in out.items():
        # the 33-token prompt is prefilled in chunks
        assert res["max_step_tokens"] <= ENGINE["max_num_batched_tokens"] < max(PROMPT_LENS), name
    return out


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", list(SPECS))
def test_split_model_equals_one_rank(ckpts, one_rank, name, tp):
    kv = SPECS[name]["num_key_value_heads"]
    heads, kv_heads = BASE["num_attention_heads"] // tp, max(1, kv // tp)
    cache = (2, ENGINE["num_kv_blocks"], ENGINE["block_size"], kv_heads, BASE["head_dim"])
    res = generate(ckpts[name], tp)
    # rank 0's KV cache holds only its heads
    assert res["heads"] == [(heads, kv_heads, cache)] * BASE["num_hidden_layers"]
    assert_equal_to_one_rank(one_rank[name], res, f"{name} TP={tp}")


@pytest.mark.parametrize("sizes,tp,match", [
    ({}, 3, "num_attention_heads=4 is not divisible by tensor_parallel_size=3"),
    (dict(num_attention_heads=12, num_key_value_heads=3), 2,
     "num_key_value_heads=3 is not divisible by tensor_parallel_size=2"),
    (dict(num_attention_heads=12, num_key_value_heads=3), 4,
     "tensor_parallel_size=4 is not divisible by num_key_value_heads=3"),
    (dict(intermediate_size=130), 4, "intermediate_size=130 is not divisible by tensor_parallel_size=4"),
], ids=["heads", "kv-heads", "kv-replicas", "intermediate"])
def test_a_size_the_ranks_do_not_divide_is_refused(sizes, tp, match):
    import transformers
    from core_runner_qwen3.model import Qwen3ForCausalLM

    from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group

    cfg = transformers.Qwen3Config(**{**BASE, **SPECS["untied"], **sizes})
    prev = set_tp_group(GroupCoordinator(rank=0, world_size=tp))
    try:
        with pytest.raises(ValueError, match=match):
            Qwen3ForCausalLM(cfg)
    finally:
        set_tp_group(prev)
