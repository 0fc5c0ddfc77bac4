"""A pooling step's outputs reach the scheduler as CPU tensors, copied in one transfer per
dtype (``runner/pooled_output.PooledCopy`` through ``AsyncOutput``), so that no request's
first read is its own device-to-host copy: the shapes, dtypes and values the state
returned, in batch order, with None kept, and no alias of a buffer the state owns."""
from __future__ import annotations

import pytest
import torch

from core_runner import PoolingParams
from core_runner.runner.async_output import AsyncOutput
from core_runner.runner.pooled_output import PooledCopy


def _pooled(device: str = "cpu") -> list[torch.Tensor | None]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return [t if t is None else t.to(device) for t in (
        base[1],  # a row view
        None,  # a request whose prompt has not ended
        torch.randn(4, 3, generator=g),  # per-token scores [tokens, labels]
        base.t()[2, :4],  # a strided view (Matryoshka cut of a transposed buffer)
        torch.randn(7, generator=g).half(),  # another dtype: its own transfer
        torch.randn(1, generator=g),  # one label
    )]


def _check(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
            continue
        assert g.device.type == "cpu" and g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w.cpu())


def test_outputs_keep_order_shape_dtype_and_none():
    pooled = _pooled()
    copy = PooledCopy(pooled)
    assert sorted(copy.tensors) == ["pooled:torch.float16", "pooled:torch.float32"]
    assert copy.tensors["pooled:torch.float32"].numel() == 5 + 12 + 4 + 1
    out = AsyncOutput(["a", "b", "c", "d", "e", "f"], None, None, None, copy).get()
    assert out.req_ids == ["a", "b", "c", "d", "e", "f"] and out.sampled_token_ids == []
    _check(out.pooled, pooled)


def test_outputs_do_not_alias_the_states_buffers():
    """On the CPU there is no transfer: the outputs must still be copies, since a state may
    write its buffers again in the next step."""
    pooled = _pooled()
    want = [None if t is None else t.clone() for t in pooled]
    out = AsyncOutput(["r"] * len(pooled), None, None, None, PooledCopy(pooled)).get()
    for t in pooled:
        if t is not None:
            t.fill_(123)
    _check(out.pooled, want)


def test_a_step_with_nothing_pooled_gives_nones():
    out = AsyncOutput(["a", "b"], None, None, None, PooledCopy([None, None])).get()
    assert out.pooled == [None, None]


def test_engine_steps_hand_the_scheduler_host_tensors(tmp_path):
    """Through the engine's own step loop (not LLM.embed, which copies again at its end)."""
    import transformers

    from core_runner import LLM

    cfg = transformers.BertConfig(vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(tmp_path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    llm = LLM(str(tmp_path), device=device, dtype="float32", max_num_seqs=4, num_kv_blocks=64)
    engine = llm.engine
    ids = [engine.add_request([5 + i, 6, 7, 8 + i], pooling_params=PoolingParams(task="embed")) for i in range(6)]
    seen = {}
    for _ in range(20):
        for o in engine.step():
            seen[o.request_id] = o
        if not engine.has_unfinished_requests():
            break
    assert sorted(seen) == sorted(ids)
    for o in seen.values():
        assert o.outputs.data.device.type == "cpu" and o.outputs.data.shape == (32,)
        assert o.outputs.data.norm().item() == pytest.approx(1.0, abs=1e-5)
