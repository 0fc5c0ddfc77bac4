"""PoolingParams.dimensions (Matryoshka, vLLM's field): the first k entries of the pooled
vector, re-normalised when normalize is on, against transformers' hidden states; refused by
name for a model that does not declare Matryoshka training, for k outside (0, hidden] and
for k not in the config's matryoshka_dimensions; /v1/embeddings passes it through (400 when
refused)."""
from __future__ import annotations

import json

import httpx
import pytest
import torch
import torch.nn.functional as F

from core_runner import LLM, PoolingParams

OPTS = dict(dtype="float32", max_num_seqs=4, num_kv_blocks=32, block_size=8)
PROMPTS = [[5, 9, 17, 3], [40, 2, 7, 7, 11, 30, 8]]


def _ckpt(tmp_path_factory, kind: str, **extra):
    import transformers

    if kind == "qwen3":
        cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       max_position_embeddings=64, eos_token_id=None, bos_token_id=None)
        model_cls = transformers.Qwen3Model
    else:
        cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=64)
        model_cls = transformers.BertModel
    torch.manual_seed(3)
    hf = model_cls(cfg).float().eval()
    path = tmp_path_factory.mktemp(kind)
    hf.save_pretrained(str(path))
    if extra:
        file = path / "config.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), **extra}))
    return str(path), hf


def _hidden(hf, ids):
    with torch.no_grad():
        t = torch.tensor([ids])
        return hf(input_ids=t, attention_mask=torch.ones_like(t)).last_hidden_state[0].float()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, single_torch_thread):
    path, hf = _ckpt(tmp_path_factory, "qwen3")
    return LLM(path, **OPTS), hf


def test_dimensions_cut_then_renormalise(qwen3):
    llm, hf = qwen3
    params = [PoolingParams(dimensions=8), PoolingParams(dimensions=8, normalize=False)]
    for p in PROMPTS:  # each prompt cut with and without normalize, beside a full one
        outs = llm.embed([p, p, p], [*params, PoolingParams()], use_tqdm=False)
        last = _hidden(hf, p)[-1]
        assert outs[0].outputs.data.shape == (8,) and outs[2].outputs.data.shape == (32,)
        assert torch.allclose(outs[0].outputs.data, F.normalize(last[:8], dim=-1), atol=1e-5)
        assert torch.allclose(outs[1].outputs.data, last[:8], atol=1e-4)
        assert torch.allclose(outs[2].outputs.data, F.normalize(last, dim=-1), atol=1e-5)
    assert llm.embed(PROMPTS[0], PoolingParams(dimensions=32), use_tqdm=False)[0].outputs.data.shape == (32,)
    for bad in (33, 0, True):
        with pytest.raises(ValueError, match=rf"dimensions={bad!r}"):
            llm.embed(PROMPTS[0], PoolingParams(dimensions=bad), use_tqdm=False)


def test_refused_unless_declared(tmp_path_factory, single_torch_thread):
    plain = LLM(_ckpt(tmp_path_factory, "bert")[0], **OPTS)
    with pytest.raises(ValueError, match="dimensions=8 is invalid: BertModel does not declare Matryoshka"):
        plain.embed(PROMPTS[0], PoolingParams(dimensions=8), use_tqdm=False)
    path, hf = _ckpt(tmp_path_factory, "bert", matryoshka_dimensions=[8, 16, 32])
    listed = LLM(path, **OPTS)
    got = listed.embed(PROMPTS[1], PoolingParams(dimensions=16, pooling_type="cls"), use_tqdm=False)
    assert torch.allclose(got[0].outputs.data, F.normalize(_hidden(hf, PROMPTS[1])[0, :16], dim=-1), atol=1e-5)
    with pytest.raises(ValueError, match=r"dimensions=12 is invalid: BertModel allows only its "
                                         r"matryoshka_dimensions \[8, 16, 32\]"):
        listed.embed(PROMPTS[0], PoolingParams(dimensions=12), use_tqdm=False)


def test_v1_embeddings_dimensions(qwen3, tmp_path_factory):
    from test_server import _Server

    llm, hf = qwen3
    s = _Server(LLM(llm.config.model, **OPTS).engine, served_model_name="q")
    try:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": [PROMPTS[0]], "dimensions": 8,
                                                       "encoding_format": "float"}, timeout=60)
        assert r.status_code == 200, r.text
        got = torch.tensor(r.json()["data"][0]["embedding"])
        assert torch.allclose(got, F.normalize(_hidden(hf, PROMPTS[0])[-1, :8], dim=-1), atol=1e-5)
        for bad in (64, "8"):
            r = httpx.post(s.url + "/v1/embeddings", json={"input": [PROMPTS[0]], "dimensions": bad}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions", r.text
            assert "dimensions" in r.json()["error"]["message"]
    finally:
        s.stop()
