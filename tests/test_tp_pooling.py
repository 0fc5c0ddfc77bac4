"""BERT embeddings under tensor parallelism: ``LLM(..., tensor_parallel_size=N)`` (the
engine's worker ranks, gloo on the CPU) pools the same vectors as one rank, for N = 2
and 4 (one attention head per rank), over a batch of mixed lengths run in one step and
two requests at a time; mean, CLS and last-token pooling.
"""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, PoolingParams

# 251 does not divide by 2 or 4: the last rank's vocabulary block is padded
VOCAB = 251
HIDDEN, HEADS, INTER = 64, 4, 128
LENGTHS = [1, 3, 8, 17, 40, 5]
TOL = 1e-5
PARAMS = {
    "mean_raw": PoolingParams(pooling_type="mean", normalize=False),
    "cls_raw": PoolingParams(pooling_type="cls", normalize=False),
    "last": PoolingParams(pooling_type="last"),
}
MAX_NUM_SEQS = (len(LENGTHS), 2)  # the whole batch in one step; two requests at a time


@pytest.fixture(scope="module")
def bert(tmp_path_factory, single_torch_thread):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2,
        num_attention_heads=HEADS, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
        initializer_range=0.1,
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


def make_llm(path: str, max_num_seqs: int, tp: int) -> LLM:
    # no chunked prefill for BERT: the budget holds the longest prompt
    return LLM(path, dtype="float32", device="cpu", max_model_len=64, block_size=4, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=64, num_kv_blocks=max_num_seqs * 16, tensor_parallel_size=tp)


def embed_all(llm: LLM, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([o.outputs.data for o in llm.embed(prompts, p, use_tqdm=False)])
            for name, p in PARAMS.items()}


@pytest.fixture(scope="module")
def ref(bert, prompts):
    """TP=1 vectors per batching; the baseline itself agrees with transformers."""
    path, hf = bert
    out = {n: embed_all(make_llm(path, n, tp=1), prompts) for n in MAX_NUM_SEQS}
    with torch.no_grad():
        want = torch.stack([hf(input_ids=torch.tensor([p])).last_hidden_state[0].mean(0) for p in prompts])
    assert (out[len(LENGTHS)]["mean_raw"] - want).abs().max().item() <= 1e-4
    return out


def rank0_shapes(llm: LLM) -> dict:
    """The driver's (rank 0's) share of the first layer, proving the model was split."""
    model = llm.engine.model
    layer = model.encoder.layer[0]
    return {
        "qkv": tuple(layer.attention.self.qkv_proj.weight.shape),
        "attn_heads": layer.attention.self.attn.num_heads,
        "attn_out": tuple(layer.attention.output.dense.weight.shape),
        "intermediate": tuple(layer.intermediate.dense.weight.shape),
        "output": tuple(layer.output.dense.weight.shape),
        "words": tuple(model.embeddings.word_embeddings.weight.shape),
        "positions": tuple(model.embeddings.position_embeddings.weight.shape),
    }


@pytest.mark.parametrize("tp", [2, 4])
def test_bert_tp_pools_as_tp1(bert, prompts, ref, tp):
    path, _ = bert
    for n in MAX_NUM_SEQS:
        llm = make_llm(path, n, tp)
        try:
            assert rank0_shapes(llm) == {
                "qkv": (3 * HIDDEN // tp, HIDDEN), "attn_heads": HEADS // tp, "attn_out": (HIDDEN, HIDDEN // tp),
                "intermediate": (INTER // tp, HIDDEN), "output": (HIDDEN, INTER // tp),
                "words": (-(-VOCAB // tp), HIDDEN), "positions": (64, HIDDEN),
            }
            got = embed_all(llm, prompts)
        finally:
            llm.engine.shutdown()
        for name, want in ref[n].items():
            assert got[name].shape == want.shape, name
            err = (got[name] - want).abs().max().item()
            assert err <= TOL, f"tp={tp} max_num_seqs={n} {name}: differs from TP=1 by {err:.3g}"
