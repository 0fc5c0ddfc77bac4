"""XLMRobertaModel (BGE-M3 shape: CLS, normalised) and XLMRobertaForSequenceClassification
(bge-reranker shape, one label) against transformers fp32 CPU, one prompt at a time, in
one mixed batch; prompts hold the pad id so positions must follow transformers' rule
(padding_idx + 1 onward, pad tokens at padding_idx, counted per prompt)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from core_runner import LLM

OPTS = dict(dtype="float32", max_num_seqs=4, num_kv_blocks=32, block_size=8)
PROMPTS = [[0, 5, 9, 1, 17, 2], [0, 40, 2], [0, 7, 1, 1, 11, 30, 8, 2], [3]]


def _ckpt(tmp_path_factory, cls_name: str, **kw):
    import transformers

    cfg = transformers.XLMRobertaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=40, type_vocab_size=1, pad_token_id=1, initializer_range=0.2, **kw)
    torch.manual_seed(9)
    hf = getattr(transformers, cls_name)(cfg).float().eval()
    path = tmp_path_factory.mktemp(cls_name)
    hf.save_pretrained(str(path))
    return str(path), hf


def _hf(hf, ids):
    t = torch.tensor([ids])
    with torch.no_grad():
        return hf(input_ids=t, attention_mask=torch.ones_like(t))


def test_positions_follow_transformers():
    from core_runner_pooling.xlm_roberta import roberta_positions
    from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaEmbeddings

    create_position_ids_from_input_ids = XLMRobertaEmbeddings.create_position_ids_from_input_ids

    flat = torch.tensor([p for prompt in PROMPTS for p in prompt])
    pos = torch.tensor([i for prompt in PROMPTS for i in range(len(prompt))])
    want = torch.cat([create_position_ids_from_input_ids(torch.tensor([p]), 1)[0] for p in PROMPTS])
    assert torch.equal(roberta_positions(flat, pos, 1), want)


def test_embed_cls_normalised(tmp_path_factory, single_torch_thread):
    path, hf = _ckpt(tmp_path_factory, "XLMRobertaModel")
    outs = LLM(path, **OPTS).embed(PROMPTS, use_tqdm=False)  # the default: CLS, L2-normalised
    for p, o in zip(PROMPTS, outs):
        want = F.normalize(_hf(hf, p).last_hidden_state[0, 0].float(), dim=-1)
        assert (o.outputs.data - want).abs().max() < 1e-5


def test_reranker_scores(tmp_path_factory, single_torch_thread):
    path, hf = _ckpt(tmp_path_factory, "XLMRobertaForSequenceClassification", num_labels=1)
    outs = LLM(path, **OPTS).classify(PROMPTS, use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        assert (o.outputs.data - torch.sigmoid(_hf(hf, p).logits[0].float())).abs().max() < 1e-5


def test_prompts_past_the_usable_positions_are_refused_by_name(tmp_path_factory, single_torch_thread):
    """40 positions, padding_idx 1: 38 tokens fit (positions 2..39); the default max_model_len
    is that, a 39-token prompt is refused when submitted, and an explicit 40 at construction."""
    import pytest

    path, hf = _ckpt(tmp_path_factory, "XLMRobertaModel")
    llm = LLM(path, **OPTS)
    assert llm.config.max_model_len == 38
    fits = [0] + [5] * 36 + [2]
    out = llm.embed([fits], use_tqdm=False)[0]
    want = F.normalize(_hf(hf, fits).last_hidden_state[0, 0].float(), dim=-1)
    assert (out.outputs.data - want).abs().max() < 1e-5
    with pytest.raises(ValueError, match="38"):
        llm.embed([fits + [7]], use_tqdm=False)
    with pytest.raises(ValueError, match=r"max_model_len=40 exceeds the 38 tokens XLMRobertaModel can place"):
        LLM(path, max_model_len=40, **OPTS)
