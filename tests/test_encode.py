"""LLM.encode(prompts, pooling_task=...) (vLLM's general pooling entry) and the /pooling
route: the same vectors as LLM.embed / LLM.classify, a pooling_task the model lacks refused
naming the valid ones, offline and as a 400 naming ``task``."""
from __future__ import annotations

import httpx
import pytest
import torch
from test_classify import _bert
from test_matryoshka import OPTS, PROMPTS, _ckpt

from core_runner import LLM, PoolingParams
from core_runner.engine.outputs import PoolingRequestOutput


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, single_torch_thread):
    return LLM(_ckpt(tmp_path_factory, "qwen3")[0], **OPTS)


def test_encode_equals_the_task_methods(embedder, tmp_path_factory):
    outs = embedder.encode(PROMPTS, pooling_task="embed", use_tqdm=False)
    assert all(isinstance(o, PoolingRequestOutput) for o in outs)
    want = embedder.embed(PROMPTS, use_tqdm=False)
    assert all(torch.equal(o.outputs.data, w.outputs.data) for o, w in zip(outs, want))
    default = embedder.encode(PROMPTS[0], PoolingParams(normalize=False), use_tqdm=False)  # None: its first task
    assert torch.equal(default[0].outputs.data, embedder.embed(PROMPTS[0], PoolingParams(normalize=False),
                                                               use_tqdm=False)[0].outputs.data)
    with pytest.raises(ValueError, match=r"pooling_task='classify'\) is invalid .* pooling tasks \['embed'\]"):
        embedder.encode(PROMPTS, pooling_task="classify", use_tqdm=False)
    path, _ = _bert(tmp_path_factory, "enc_cls", 128, num_labels=3)
    cls = LLM(path, **OPTS)
    got = cls.encode(PROMPTS, pooling_task="classify", use_tqdm=False)
    probs = cls.classify(PROMPTS, use_tqdm=False)
    assert all(torch.equal(g.outputs.data, p.outputs.data) for g, p in zip(got, probs))
    with pytest.raises(ValueError, match=r"expected one of its pooling tasks \['classify', 'score'\]"):
        cls.encode(PROMPTS, pooling_task="embed", use_tqdm=False)


def test_pooling_route(embedder):
    from test_server import _Server

    s = _Server(LLM(embedder.config.model, **OPTS).engine, served_model_name="q")
    try:
        r = httpx.post(s.url + "/pooling", json={"model": "q", "input": PROMPTS}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["usage"]["prompt_tokens"] == sum(map(len, PROMPTS))
        want = embedder.embed(PROMPTS, use_tqdm=False)
        for i, (d, w) in enumerate(zip(body["data"], want)):
            assert d["index"] == i and d["object"] == "pooling"
            assert torch.allclose(torch.tensor(d["data"]), w.outputs.data, atol=1e-6)
        r = httpx.post(s.url + "/pooling", json={"input": PROMPTS, "task": "classify"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "task", r.text
        assert "['embed']" in r.json()["error"]["message"]
    finally:
        s.stop()
