"""Pooling family, decoder side: a tiny random transformers ``Qwen3Model`` checkpoint
(config.architectures == ["Qwen3Model"]) embedded with last-token pooling + normalise,
against transformers one prompt at a time; mixed lengths, any batch composition,
chunked prefill (mean and cls carried across chunks), preemption; tasks never mix."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from core_runner import LLM, PoolingParams, SamplingParams

VOCAB = 256
LENGTHS = [1, 2, 5, 9, 17, 31, 40, 64, 100, 127]
TOL = 1e-4


@pytest.fixture(scope="module")
def qwen3_embed(tmp_path_factory, single_torch_thread):
    import transformers

    cfg = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, initializer_range=0.1,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(7)
    hf = transformers.Qwen3Model(cfg).float().eval()
    path = tmp_path_factory.mktemp("qwen3_embed")
    hf.save_pretrained(str(path))
    assert transformers.AutoConfig.from_pretrained(str(path)).architectures == ["Qwen3Model"]
    return str(path), hf


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.fixture(scope="module")
def refs(qwen3_embed, prompts):
    """{pooling: [vector per prompt]} from transformers' Qwen3Model, batch 1, explicit mask."""
    _, hf = qwen3_embed
    out = {"last": [], "mean": [], "cls": [], "last_raw": []}
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            h = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0].float()
            out["last"].append(F.normalize(h[-1], dim=-1))
            out["last_raw"].append(h[-1])
            out["mean"].append(F.normalize(h.mean(0), dim=-1))
            out["cls"].append(F.normalize(h[0], dim=-1))
    return out


def make_llm(path: str, max_num_seqs: int, budget: int, num_kv_blocks: int | None = None, **kw) -> LLM:
    max_model_len, block = 128, 4
    return LLM(path, dtype="float32", max_model_len=max_model_len, max_num_seqs=max_num_seqs, block_size=block,
               max_num_batched_tokens=budget, num_kv_blocks=num_kv_blocks or max_num_seqs * (max_model_len // block),
               **kw)


def assert_close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = (got - ref).abs().max().item()
    assert err <= TOL, f"{what}: differs from transformers by {err:.3g}"


# (max_num_seqs, token budget): one step per batch, a shared budget, chunked prefill
@pytest.mark.parametrize("seqs,budget", [(16, 2048), (3, 48), (2, 7)])
def test_last_token_matches_transformers(qwen3_embed, prompts, refs, seqs, budget):
    path, _ = qwen3_embed
    llm = make_llm(path, seqs, budget)
    assert llm.engine.plan.chunked_prefill
    assert llm.engine.model_state.default_pooling_type == "last"
    order = list(range(len(prompts)))
    random.Random(seqs).shuffle(order)
    outs = llm.embed([prompts[i] for i in order])
    for o, i in zip(outs, order):
        assert o.prompt_token_ids == prompts[i] and o.outputs.data.dtype == torch.float32
        assert_close(o.outputs.data, refs["last"][i], f"prompt of {LENGTHS[i]} tokens")
    raw = llm.embed(prompts[3], PoolingParams(normalize=False))[0].outputs.data
    assert_close(raw, refs["last_raw"][3], "unnormalised")


def test_any_batch_composition_and_staggered_adds(qwen3_embed, prompts, refs):
    path, _ = qwen3_embed
    llm = make_llm(path, 3, 24)
    eng = llm.engine
    rng = random.Random(0)
    outs: dict[str, object] = {}
    pending = list(range(len(prompts))) * 2  # every prompt twice, in different company
    rng.shuffle(pending)
    ids = {}
    while pending or eng.has_unfinished_requests():
        for _ in range(rng.randint(0, 3)):  # a few new requests between steps
            if pending:
                i = pending.pop()
                ids[eng.add_request(prompts[i], pooling_params=PoolingParams())] = i
        for o in eng.step():
            outs[o.req_id] = o
    assert len(outs) == 2 * len(prompts)
    for rid, o in outs.items():
        assert_close(o.outputs.data, refs["last"][ids[rid]], f"request {rid}")


def test_mean_and_cls_carried_across_chunks(qwen3_embed, prompts, refs):
    """Mean pooling sums each chunk into the row; cls keeps the first chunk's first token."""
    path, _ = qwen3_embed
    llm = make_llm(path, 3, 10)  # prompts of up to 127 tokens in chunks of <= 10
    kinds = ["mean", "cls", "last"]
    params = [PoolingParams(pooling_type=kinds[i % 3]) for i in range(len(prompts))]
    outs = llm.embed(prompts, params)
    for i, o in enumerate(outs):
        assert_close(o.outputs.data, refs[kinds[i % 3]][i], f"{kinds[i % 3]} pooling, {LENGTHS[i]} tokens")


def test_preemption_restarts_pooling(qwen3_embed, prompts, refs):
    path, _ = qwen3_embed
    # 40 blocks of 4 tokens; with async scheduling a finished request keeps its blocks one
    # step longer, so the next long prompt's chunks run out of blocks and get preempted
    llm = make_llm(path, 3, 64, num_kv_blocks=40, async_scheduling=True)
    which = [9, 9, 8] * 2
    outs = llm.embed([prompts[i] for i in which], PoolingParams(pooling_type="mean"))
    assert llm.engine.scheduler.num_preemptions > 0
    for o, i in zip(outs, which):
        assert_close(o.outputs.data, refs["mean"][i], f"preempted mean pooling, {LENGTHS[i]} tokens")


def test_prompt_limit_with_chunked_prefill(qwen3_embed):
    path, _ = qwen3_embed
    llm = make_llm(path, 2, 16)
    with pytest.raises(ValueError, match=r"prompt 0: .*embeds at most 127 \(max_model_len=128"):
        llm.embed([[5] * 128])
    assert llm.embed([[5] * 127])[0].outputs.data.shape == (64,)


def test_mixed_tasks_rejected(qwen3_embed, untied):
    """One model per engine: a pooling request to a generating engine (and the reverse)
    is rejected at add, and nothing is left queued."""
    gen = LLM(untied.path, dtype="float32", max_model_len=64, max_num_seqs=2, block_size=4, num_kv_blocks=32)
    with pytest.raises(ValueError, match=r"LLM.embed\(\) needs a model with task 'embed'.*LLM.generate"):
        gen.embed([[5, 6, 7]])
    with pytest.raises(ValueError, match="not 'embed'"):
        gen.engine.add_request([5, 6, 7], pooling_params=PoolingParams())
    assert not gen.engine.has_unfinished_requests()
    out = gen.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 2 and not hasattr(out, "embedding")
    path, _ = qwen3_embed
    emb = make_llm(path, 2, 64)
    with pytest.raises(ValueError, match="not 'generate'"):
        emb.engine.add_request([5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"LLM.generate\(\) needs a model with task 'generate'"):
        emb.generate([[5, 6, 7]])
    assert not emb.engine.has_unfinished_requests()


def test_registration():
    from core_runner.plugins import load_plugins
    from core_runner.registry import builtin_table

    pm = load_plugins()
    table = builtin_table()
    for arch in ("BertModel", "Qwen3Model"):
        reg = pm.registry.get(arch)
        assert reg.plugin == "pooling" and reg.tasks == ("embed",)
        assert reg.model_state == "model_states.pooling:PoolingModelState"
        assert table[arch]["package"] == "core-runner-pooling" and table[arch]["tasks"] == ["embed"]
        for cap, c in reg.capabilities.items():
            assert table[arch]["capabilities"][cap] == c.state
    assert pm.registry.get("BertModel").capability("chunked_prefill").state == "unsupported"
    assert pm.registry.get("Qwen3Model").capability("chunked_prefill").state == "supported"
