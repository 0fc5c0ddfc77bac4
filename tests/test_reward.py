"""Task reward (issue 38): tiny random transformers ``LlamaForSequenceClassification``
(one raw reward at the last token) and ``LlamaForTokenClassification`` (a reward per prompt
token) against transformers in fp32, batched with mixed lengths and under chunked prefill."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, PoolingParams

TOL = 1e-5


def _save(tmp_path_factory, cls_name: str, name: str, **kw):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   initializer_range=0.2, **kw)
    torch.manual_seed(11)
    hf = getattr(transformers, cls_name)(cfg).float().eval()
    path = tmp_path_factory.mktemp(name)
    hf.save_pretrained(str(path))
    return str(path), hf


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=g).tolist() for n in lengths]


def _ref(hf, p: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([p])).logits[0].float()


@pytest.fixture(scope="module")
def seq_reward(tmp_path_factory, single_torch_thread):
    return _save(tmp_path_factory, "LlamaForSequenceClassification", "llama_rm", num_labels=1)


def test_sequence_reward_is_raw_last_token_logit(seq_reward):
    path, hf = seq_reward
    llm = LLM(path, dtype="float32", max_num_seqs=4, num_kv_blocks=64, block_size=8, max_num_batched_tokens=7)
    assert llm.engine.tasks == ("reward", "classify", "score")
    prompts = _prompts([3, 9, 17, 5], seed=1)
    outs = llm.reward(prompts, use_tqdm=False)
    for p, o in zip(prompts, outs):
        want = _ref(hf, p)
        assert o.outputs.data.shape == (1,)
        assert torch.allclose(o.outputs.data, want, atol=TOL), (o.outputs.data, want)  # raw: no sigmoid
    # the same model classifies (activated by default) and rewards with the activation when asked
    probs = llm.classify(prompts[:1], use_tqdm=False)[0].outputs.data
    act = llm.reward(prompts[:1], PoolingParams(use_activation=True), use_tqdm=False)[0].outputs.data
    assert torch.allclose(probs, torch.sigmoid(_ref(hf, prompts[0])), atol=TOL)
    assert torch.allclose(act, probs, atol=TOL)
    enc = llm.encode(prompts[:1], use_tqdm=False)[0].outputs.data  # encode's default task is the first: reward
    assert torch.allclose(enc, _ref(hf, prompts[0]), atol=TOL)


def test_token_reward_per_prompt_token_under_chunks(tmp_path_factory, single_torch_thread):
    path, hf = _save(tmp_path_factory, "LlamaForTokenClassification", "llama_tok", num_labels=2)
    llm = LLM(path, dtype="float32", max_num_seqs=2, num_kv_blocks=64, block_size=8, max_num_batched_tokens=6)
    prompts = _prompts([13, 4, 8], seed=2)  # 13 tokens run in 3 chunks; rows are reused
    params = [PoolingParams(), PoolingParams(use_activation=True), PoolingParams()]
    outs = llm.reward(prompts, params, use_tqdm=False)
    for p, pp, o in zip(prompts, params, outs):
        want = _ref(hf, p)
        want = torch.softmax(want, -1) if pp.use_activation else want
        assert o.outputs.data.shape == (len(p), 2)
        assert torch.allclose(o.outputs.data, want, atol=TOL), float((o.outputs.data - want).abs().max())
    with pytest.raises(ValueError, match="reward"):
        llm.classify(prompts[:1], use_tqdm=False)
    with pytest.raises(ValueError, match="pooling_type='mean'"):
        llm.reward(prompts[:1], PoolingParams(pooling_type="mean"), use_tqdm=False)


def test_embedder_refuses_all_pooling_by_name():
    with pytest.raises(ValueError, match="pooling_type"):
        PoolingParams(pooling_type="max")
    assert PoolingParams(task="reward").activate is False
    assert PoolingParams(task="classify").activate is True
