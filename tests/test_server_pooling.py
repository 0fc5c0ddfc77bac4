"""/classify, /score + /v1/score, /rerank + /v1/rerank over plain HTTP (the openai client has
no such endpoints): a tiny random cross-encoder (BertForSequenceClassification, one label,
the MiniLM tokenizer) and the MiniLM embedder; each answer equals ``LLM.score`` /
``LLM.classify`` offline on an engine of the same checkpoint."""
from __future__ import annotations

import httpx
import pytest
import torch
from test_classify import DOCS, QUERY, _bert, _minilm
from test_server import _Server

from core_runner import LLM

OPTS = dict(dtype="float32", max_num_seqs=8, num_kv_blocks=64, block_size=16)
TOL = 1e-5


@pytest.fixture(scope="module")
def ce(tmp_path_factory, single_torch_thread):
    path, _ = _bert(tmp_path_factory, "srv_ce", 30522, tokenizer=True, num_labels=1)
    offline = LLM(path, **OPTS)
    s = _Server(LLM(path, **OPTS).engine, served_model_name="ce")
    yield s, offline
    s.stop()


@pytest.fixture(scope="module")
def emb(single_torch_thread):
    s = _Server(LLM(_minilm(), **OPTS).engine, served_model_name="minilm")
    yield s, LLM(_minilm(), **OPTS)
    s.stop()


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_score_and_rerank_with_a_cross_encoder(ce):
    server, offline = ce
    want = [o.outputs.score for o in offline.score(QUERY, DOCS, use_tqdm=False)]
    for path in ("/score", "/v1/score"):
        r = _post(server, path, {"model": "ce", "text_1": QUERY, "text_2": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == "ce" and body["usage"]["prompt_tokens"] > 0
        assert [d["index"] for d in body["data"]] == list(range(len(DOCS)))
        assert all(d["object"] == "score" for d in body["data"])
        assert max(abs(d["score"] - w) for d, w in zip(body["data"], want)) < TOL
    pairwise = _post(server, "/v1/score", {"text_1": [QUERY, "dogs"], "text_2": DOCS[:2]}).json()["data"]
    assert abs(pairwise[1]["score"] - offline.score("dogs", DOCS[1], use_tqdm=False)[0].outputs.score) < TOL
    best = sorted(range(len(DOCS)), key=lambda i: -want[i])
    for path in ("/rerank", "/v1/rerank"):
        r = _post(server, path, {"model": "ce", "query": QUERY, "documents": DOCS, "top_n": 2})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == best[:2]
        assert [x["document"]["text"] for x in results] == [DOCS[i] for i in best[:2]]
        assert all(abs(x["relevance_score"] - want[x["index"]]) < TOL for x in results)
    everything = _post(server, "/rerank", {"query": QUERY, "documents": DOCS, "return_documents": False}).json()
    assert [x["index"] for x in everything["results"]] == best and "document" not in everything["results"][0]
    c = _post(server, "/classify", {"input": [QUERY, "x"]}).json()["data"]
    assert [d["num_classes"] for d in c] == [1, 1] and c[0]["label"] == "LABEL_0"
    assert abs(c[0]["probs"][0] - offline.classify([QUERY], use_tqdm=False)[0].outputs.probs[0]) < TOL


@pytest.mark.parametrize("path, body, param", [
    ("/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/rerank", {"query": 3, "documents": DOCS}, "query"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
    ("/score", {"text_2": "c"}, "text_1"),
    ("/classify", {"input": "a", "use_activation": "yes"}, "use_activation"),
])
def test_bad_requests_are_400_naming_the_field(ce, path, body, param):
    server, _ = ce
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_score_with_an_embedding_model_is_cosine(emb):
    server, offline = emb
    want = [o.outputs.score for o in offline.score(QUERY, DOCS, use_tqdm=False)]
    got = _post(server, "/v1/score", {"text_1": QUERY, "text_2": DOCS}).json()["data"]
    assert max(abs(d["score"] - w) for d, w in zip(got, want)) < TOL
    ranked = _post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 1}).json()["results"]
    assert len(ranked) == 1 and ranked[0]["index"] == max(range(len(DOCS)), key=lambda i: want[i])
    r = _post(server, "/classify", {"input": "a"})
    assert r.status_code == 400 and "classify" in r.json()["error"]["message"]


def test_pooling_route_serves_per_token_rewards(tmp_path_factory, single_torch_thread):
    """/pooling on a reward model (vLLM serves reward there): data[i].data is the prompt's
    [tokens, labels] raw scores, equal to LLM.reward offline."""
    from test_reward import _prompts, _save

    path, _ = _save(tmp_path_factory, "LlamaForTokenClassification", "srv_tok", num_labels=2)
    offline = LLM(path, **OPTS)
    prompts = _prompts([5, 3], seed=4)
    want = [o.outputs.data for o in offline.reward(prompts, use_tqdm=False)]
    s = _Server(LLM(path, **OPTS).engine, served_model_name="rm")
    try:
        r = _post(s, "/pooling", {"model": "rm", "input": prompts})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["object"] for d in data] == ["pooling", "pooling"]
        for d, w in zip(data, want):
            got = torch.tensor(d["data"])
            assert got.shape == w.shape and float((got - w).abs().max()) < TOL
        bad = _post(s, "/pooling", {"input": prompts, "task": "embed"})
        assert bad.status_code == 400 and "reward" in bad.text
    finally:
        s.stop()
