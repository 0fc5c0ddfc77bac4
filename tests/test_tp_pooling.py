"""BERT embeddings under tensor parallelism: TP=2 pools the same vectors as TP=1 (mean,
CLS and last token; one step and several), for a batch of mixed lengths.

Each rank runs an unmodified single-process engine whose model was built with the rank's
TP group installed (an SPMD run: every rank gets the same requests in the same order, so
the collectives line up); its pooled outputs are compared with a plain TP=1 engine in
the test process. One ``run_ranks`` call (each costs seconds of imports per rank).
"""
from __future__ import annotations

import pytest
import torch
from tp_harness import run_ranks

from core_runner import LLM, PoolingParams

# 251 does not divide by 2 or 4: the last rank's vocabulary block is padded
VOCAB = 251
LENGTHS = [1, 3, 8, 17, 40, 5]
TOL = 1e-5
PARAMS = {
    "mean_raw": PoolingParams(pooling_type="mean", normalize=False),
    "cls_raw": PoolingParams(pooling_type="cls", normalize=False),
    "last": PoolingParams(pooling_type="last"),
}


@pytest.fixture(scope="module")
def bert(tmp_path_factory, single_torch_thread):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", initializer_range=0.1,
    )
    torch.manual_seed(3)
    hf = transformers.BertModel(cfg, add_pooling_layer=False).float().eval()
    path = tmp_path_factory.mktemp("tp_bert")
    hf.save_pretrained(str(path))
    return str(path), hf


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(5)
    out = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]
    out[-1][-1] = VOCAB - 1  # an id of the last rank's (padded) block
    return out


def make_llm(path: str, max_num_seqs: int) -> LLM:
    # no chunked prefill for BERT: the budget holds the longest prompt
    return LLM(path, dtype="float32", device="cpu", max_model_len=64, block_size=4, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=64, num_kv_blocks=max_num_seqs * 16)


def embed_all(llm: LLM, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([o.outputs.data for o in llm.embed(prompts, p, use_tqdm=False)])
            for name, p in PARAMS.items()}


def rank_embed(path: str, prompts: list[list[int]]) -> dict:
    """On one rank: the pooled vectors of every prompt, batched all at once and two at a
    time (several steps), plus the shapes that prove the layers were split. Vectors go
    back as lists: a tensor put on the harness's queue is shared through a file
    descriptor that dies with the rank, which may exit before the parent reads it."""
    llm = make_llm(path, max_num_seqs=len(prompts))
    layer = llm.engine.model.encoder.layer[0]
    shapes = {
        "qkv": tuple(layer.attention.self.qkv_proj.weight.shape),
        "attn_heads": layer.attention.self.attn.num_heads,
        "attn_out": tuple(layer.attention.output.dense.weight.shape),
        "intermediate": tuple(layer.intermediate.dense.weight.shape),
        "output": tuple(layer.output.dense.weight.shape),
        "words": tuple(llm.engine.model.embeddings.word_embeddings.weight.shape),
        "positions": tuple(llm.engine.model.embeddings.position_embeddings.weight.shape),
    }
    out = {"one_step": embed_all(llm, prompts), "two_at_a_time": embed_all(make_llm(path, max_num_seqs=2), prompts)}
    return {"shapes": shapes, **{k: {n: t.tolist() for n, t in v.items()} for k, v in out.items()}}


def assert_close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    err = (got - ref).abs().max().item()
    assert err <= TOL, f"{what}: differs from TP=1 by {err:.3g}"


def hf_mean(hf, prompts: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack([hf(input_ids=torch.tensor([p])).last_hidden_state[0].mean(0) for p in prompts])


def test_bert_tp2_pools_as_tp1(bert, prompts):
    tp = 2
    path, hf = bert
    ref = embed_all(make_llm(path, max_num_seqs=len(prompts)), prompts)
    # the TP=1 baseline itself is right, so agreeing with it means agreeing with transformers
    assert (ref["mean_raw"] - hf_mean(hf, prompts)).abs().max().item() <= 1e-4

    results = run_ranks(rank_embed, tp, path, prompts)
    h, heads, inter = 64, 4, 128
    rows = -(-VOCAB // tp)
    for rank, res in enumerate(results):
        assert res["shapes"] == {
            "qkv": (3 * h // tp, h), "attn_heads": heads // tp, "attn_out": (h, h // tp),
            "intermediate": (inter // tp, h), "output": (h, inter // tp), "words": (rows, h),
            "positions": (64, h),
        }, f"rank {rank}"
        for batching in ("one_step", "two_at_a_time"):
            for name in PARAMS:
                assert_close(torch.tensor(res[batching][name]), ref[name], f"tp={tp} rank {rank} {batching} {name}")
