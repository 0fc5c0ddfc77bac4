"""FusedMoE and Qwen3MoeForCausalLM split over ranks, tensor- and expert-parallel.

Layer and loading checks build a rank's layer in this process (``set_tp_group`` with a
group of the wanted size and rank, no process group): with ``reduce_results=False`` a
rank returns its partial sum, and the ranks' partial sums must add up to the whole
layer. The model check runs ``LLM(..., tensor_parallel_size=N)`` with the experts split
by intermediate units and, with ``enable_expert_parallel``, whole experts per rank, and
compares with a one-rank LLM: equal greedy tokens, logits within 1e-4 (chunked
prefill). The tiny config has 8 experts (top-2), 4 query and 2 KV heads and a dense
layer (mlp_only_layers), so TP=4 also replicates KV heads and leaves 2 experts per rank.
"""
from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from checkpoint_surgery import edit_tensors
from helpers import random_prompts
from safetensors.torch import load_file

from core_runner.distributed.parallel_state import GroupCoordinator, set_tp_group
from core_runner.layers.fused_moe import FusedMoE, fused_moe_ref

CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    rope_theta=10000.0, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[1], tie_word_embeddings=False, initializer_range=0.12,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
PROMPT_LENS = (6, 21, 30)
NEW_TOKENS = 6
ENGINE = dict(device="cpu", dtype="float32", max_model_len=64, max_num_seqs=4, block_size=4, num_kv_blocks=64,
              max_num_batched_tokens=16, enforce_eager=True)
LOGIT_ATOL = 1e-4
MODES = {"tp": False, "ep": True}  # mode -> expert_parallel


@contextmanager
def as_rank(rank: int, world_size: int, expert_parallel: bool = False):
    """Layers built inside are those of ``rank``; no collective may run."""
    prev = set_tp_group(GroupCoordinator(rank=rank, world_size=world_size, expert_parallel=expert_parallel))
    try:
        yield
    finally:
        set_tp_group(prev)


def random_experts(e: int, h: int, i: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(e, i, h, generator=g) * 0.2, torch.randn(e, i, h, generator=g) * 0.2,
            torch.randn(e, h, i, generator=g) * 0.2)


def load_per_expert(moe: FusedMoE, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> None:
    """Hand every expert's checkpoint tensors to the layer, as the loader does."""
    for e in range(gate.shape[0]):
        moe.w13.weight_loader(moe.w13.weight, gate[e], (e, "gate"))
        moe.w13.weight_loader(moe.w13.weight, up[e], (e, "up"))
        moe.w2.weight_loader(moe.w2.weight, down[e], (e, "down"))


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("mode", list(MODES))
def test_rank_partial_sums_add_up_to_the_whole_layer(mode, tp):
    e, h, i, t, k = 8, 32, 24, 21, 3
    gate, up, down = random_experts(e, h, i, seed=tp)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=g)
    whole = fused_moe_ref(x, torch.cat([gate, up], dim=1), down, w, ids)
    total = torch.zeros_like(whole)
    for rank in range(tp):
        with as_rank(rank, tp, MODES[mode]):
            moe = FusedMoE(e, h, i, impl="torch", reduce_results=False)
            stacked = FusedMoE(e, h, i, impl="torch", reduce_results=False)
        local_e, local_i = (e // tp, i) if mode == "ep" else (e, i // tp)
        mine = range(rank * local_e, (rank + 1) * local_e) if mode == "ep" else range(e)
        assert moe.w13.weight.shape == (local_e, 2 * local_i, h) and moe.w2.weight.shape == (local_e, h, local_i)
        # the loader must require this rank's experts and no other's
        assert moe.w13.weight.shard_ids == tuple((j, s) for j in mine for s in ("gate", "up"))
        assert moe.w2.weight.shard_ids == tuple((j, "down") for j in mine)
        load_per_expert(moe, gate, up, down)
        # an already stacked checkpoint tensor gives the same slices
        stacked.w13.weight_loader(stacked.w13.weight, torch.cat([gate, up], dim=1))
        stacked.w2.weight_loader(stacked.w2.weight, down)
        assert torch.equal(stacked.w13.weight, moe.w13.weight) and torch.equal(stacked.w2.weight, moe.w2.weight)
        part = moe(x, w, ids)
        assert not torch.allclose(part, whole, atol=1e-3), f"rank {rank} computed the whole layer, not its part"
        total += part
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ep,match", [(True, "num_experts=8 is not divisible by tensor_parallel_size=3"),
                                      (False, "moe_intermediate_size=32 is not divisible by tensor_parallel_size=3")])
def test_a_size_the_ranks_do_not_divide_is_refused(ep, match):
    with as_rank(0, 3, ep), pytest.raises(ValueError, match=match):
        FusedMoE(8, 64, 32)


def test_bad_expert_shards_are_refused_under_expert_parallel():
    gate, _, _ = random_experts(8, 16, 8, seed=0)
    with as_rank(1, 2, True):
        moe = FusedMoE(8, 16, 8)
    with pytest.raises(ValueError, match=r"expert shard \(8, 'gate'\) is invalid: expected \(0..7"):
        moe.w13.weight_loader(moe.w13.weight, gate[0], (8, "gate"))
    with pytest.raises(ValueError, match=r"expert 5 gate: checkpoint tensor has shape \(8, 15\), expected \(8, 16\)"):
        moe.w13.weight_loader(moe.w13.weight, gate[5][:, :15], (5, "gate"))


# ---------------------------------------------------------------------------------
# loading a checkpoint into one rank's model
# ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, single_torch_thread) -> str:
    import transformers

    path = tmp_path_factory.mktemp("qwen3_moe_tp") / "moe"
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**CONFIG)).float().eval().save_pretrained(str(path))
    return str(path)


def rank_model(path, rank: int, world_size: int, expert_parallel: bool):
    from core_runner_qwen3.model_moe import Qwen3MoeForCausalLM

    from core_runner.loader import load_hf_config, load_weights

    with as_rank(rank, world_size, expert_parallel):
        model = Qwen3MoeForCausalLM(load_hf_config(path))
        load_weights(model, path)
    return model


@pytest.mark.parametrize("mode", list(MODES))
def test_a_rank_loads_its_slices_of_the_experts(ckpt, mode):
    tensors = load_file(f"{ckpt}/model.safetensors")
    e, i = CONFIG["num_experts"], CONFIG["moe_intermediate_size"]
    experts = rank_model(ckpt, 1, 2, MODES[mode]).model.layers[0].mlp.experts
    for j in range(e):
        name = f"model.layers.0.mlp.experts.{j}"
        gate, up, down = (tensors[f"{name}.{p}_proj.weight"] for p in ("gate", "up", "down"))
        if mode == "ep":  # rank 1 of 2 holds experts 4..7 whole
            if j >= e // 2:
                assert torch.equal(experts.w13.weight[j - e // 2], torch.cat([gate, up]))
                assert torch.equal(experts.w2.weight[j - e // 2], down)
        else:  # every expert, the second half of its intermediate units
            assert torch.equal(experts.w13.weight[j], torch.cat([gate[i // 2:], up[i // 2:]]))
            assert torch.equal(experts.w2.weight[j], down[:, i // 2:])


def test_expert_parallel_loading_needs_only_the_ranks_experts(ckpt, tmp_path):
    from core_runner.loader import CheckpointError

    gone = "model.layers.2.mlp.experts.1.up_proj.weight"  # an expert of rank 0 of 2

    def drop(t):
        del t[gone]

    edited = str(edit_tensors(ckpt, tmp_path / "edited", drop))
    rank_model(edited, 1, 2, True)  # rank 1 neither needs nor misses it
    with pytest.raises(CheckpointError, match=rf"1 tensor\(s\) .*: \['{gone}'\]"):
        rank_model(edited, 0, 2, True)


# ---------------------------------------------------------------------------------
# the whole model through the engine
# ---------------------------------------------------------------------------------
def generate(path: str, tp: int = 1, expert_parallel: bool = False) -> dict:
    """Greedy tokens, every recorded logits row, the largest step, and the shape of rank
    0's stacked w13 in the first sparse layer."""
    from helpers import Recorder, greedy, run

    from core_runner import LLM

    engine = LLM(path, tensor_parallel_size=tp, enable_expert_parallel=expert_parallel, **ENGINE).engine
    try:
        rec = Recorder(engine)
        prompts = random_prompts(list(PROMPT_LENS), seed=5)
        outs = run(engine, [(f"r{i}", p, greedy(NEW_TOKENS)) for i, p in enumerate(prompts)])
        return {
            "tokens": {r: list(o.token_ids) for r, o in outs.items()},
            "logits": {(r, pos): lg.clone() for r in outs for pos, lg in rec.logits_of(r)},
            "max_step_tokens": max(s.num_tokens for s in rec.steps),
            "w13": tuple(engine.model.model.layers[0].mlp.experts.w13.weight.shape),
        }
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def one_rank(ckpt) -> dict:
    res = generate(ckpt)
    assert res["max_step_tokens"] <= ENGINE["max_num_batched_tokens"] < max(PROMPT_LENS)  # chunked prefill
    return res


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("mode", list(MODES))
def test_split_model_equals_one_rank(ckpt, one_rank, mode, tp):
    e, h, i = CONFIG["num_experts"], CONFIG["hidden_size"], CONFIG["moe_intermediate_size"]
    got = generate(ckpt, tp, MODES[mode])
    what = f"{mode} TP={tp}"
    assert got["w13"] == ((e // tp, 2 * i, h) if mode == "ep" else (e, 2 * i // tp, h)), what
    assert got["tokens"] == one_rank["tokens"], f"{what}: greedy tokens differ from TP=1"
    assert got["logits"].keys() == one_rank["logits"].keys(), f"{what}: other logits rows"
    for key, ref in one_rank["logits"].items():
        err = (got["logits"][key] - ref).abs().max().item()
        assert err <= LOGIT_ATOL, f"{what}: logits of {key} differ from TP=1 by {err:.3g}"
