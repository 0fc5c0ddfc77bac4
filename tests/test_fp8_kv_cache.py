"""kv_cache_dtype (fp8 KV cache): the option, the refusals, the pool size, the torch
reference path against the model-dtype cache (docs/fp8_kv_cache.md)."""
from __future__ import annotations

import pytest
import torch
from helpers import make_engine, random_prompts

from core_runner import LLM
from core_runner.attention.torch_backend import paged_attention_ref, write_kv_ref
from core_runner.config import EngineConfig
from core_runner.conformance.harness import Recorder, greedy, run
from core_runner.conformance.options_kv import LOGIT_REL_TOL
from core_runner.kv_cache_dtype import quantize_ref


def test_invalid_kv_cache_dtype_is_refused_naming_valid_values(untied):
    with pytest.raises(ValueError, match=r"kv_cache_dtype='int8'.*'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2'"):
        EngineConfig(model=str(untied.path), kv_cache_dtype="int8")


def test_quantize_saturates_instead_of_nan():
    x = torch.tensor([1000.0, -1000.0, 0.3])
    q = quantize_ref(x, torch.float8_e4m3fn).float()
    assert q.tolist()[:2] == [448.0, -448.0] and torch.isfinite(q).all()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_reference_paged_attention_reads_fp8_cache(dtype):
    g = torch.Generator().manual_seed(0)
    T, H, KH, D, bs = 6, 4, 2, 16, 4
    k, v, q = (torch.randn(T, n, D, generator=g) for n in (KH, KH, H))
    caches = {dt: torch.zeros(2, 3, bs, KH, D, dtype=dt) for dt in (torch.float32, dtype)}
    slots = torch.tensor([5, 6, 7, 0, 1, 2])  # blocks 1 then 0
    bt = torch.tensor([[1, 0, 2]])
    outs = {}
    for dt, c in caches.items():
        write_kv_ref(c, k, v, slots)
        outs[dt] = paged_attention_ref(q, c, torch.tensor([0, T]), torch.tensor([T]), bt, 0.25)
    assert caches[dtype].dtype == dtype
    err = (outs[dtype] - outs[torch.float32]).abs().max().item()
    # e4m3 keeps 3 mantissa bits, e5m2 2: a relative step of 1/16 or 1/8 (errors add over K and V) on unit-scale values
    assert 0 < err < (0.08 if dtype == torch.float8_e4m3fn else 0.25)


def test_fp8_pool_holds_more_tokens_and_tracks_model_dtype_cache(untied):
    per_token = make_engine(untied).memory_report()["kv_pool_bytes_per_token"]
    mem = 2 * 40 * 4 * per_token  # kv_cache_memory_fraction 0.5 of it: 40 float32 blocks of 4 tokens
    engines = {d: LLM(untied.path, dtype="float32", device="cpu", max_model_len=64, max_num_seqs=16, block_size=4,
                      kv_cache_dtype=d, memory_probe=lambda dev: (mem, mem)).engine for d in ("auto", "fp8")}
    blocks = {d: e.num_blocks for d, e in engines.items()}
    rep = {d: e.memory_report()["kv_pool_bytes_per_token"] for d, e in engines.items()}
    assert rep["auto"] == 4 * rep["fp8"] == per_token  # float32 on the CPU; bf16 on a GPU gives 2x
    assert (blocks["auto"], blocks["fp8"]) == (40, 160)
    caches = engines["fp8"].debug.paged_caches()
    assert caches and all(t.dtype == torch.float8_e4m3fn for t in caches.values())
    prompts = random_prompts([9, 6], seed=3)
    logits = {}
    for d, e in engines.items():
        rec = Recorder(e)
        run(e, [(f"r{i}", p, greedy(3)) for i, p in enumerate(prompts)])
        logits[d] = torch.stack([lg for i in range(2) for lg in rec.sampling_logits(f"r{i}", len(prompts[i]))])
    a, b = logits["auto"].float(), logits["fp8"].float()
    rel = ((a - b).abs().amax(-1) / (a.amax(-1) - a.amin(-1))).max().item()
    assert 0 < rel < LOGIT_REL_TOL  # the fp8 cache changes the logits, within the documented tolerance


def test_refused_by_name_for_a_family_without_the_capability(untied):
    from core_runner.oracle import UnsupportedError, check_kv_cache_dtype
    from core_runner.registry import Capability, Registration

    reg = Registration(architecture="X", model="m:X", model_state="m:S",
                       capabilities={"kv_cache_dtype:fp8": Capability("not applicable", "attention-free")})
    cfg = EngineConfig(model=str(untied.path), kv_cache_dtype="fp8")
    with pytest.raises(UnsupportedError, match="kv_cache_dtype='fp8'.*not applicable: attention-free"):
        check_kv_cache_dtype(cfg, reg)


def test_fp8_cache_with_prefix_hits_and_ngram_speculation(untied):
    """A prefix hit reads the first request's fp8 blocks and gives the tokens a miss gives;
    n-gram speculation over an fp8 cache gives the tokens plain decoding over it gives."""
    prompt = (random_prompts([6], seed=5)[0] * 3)[:16]  # repeats: the n-gram proposer finds matches
    plain = make_engine(untied, kv_cache_dtype="fp8", enable_prefix_caching=False)
    want = run(plain, [("a", prompt, greedy(6))])["a"].token_ids
    cached = make_engine(untied, kv_cache_dtype="fp8")
    first = run(cached, [("a", prompt, greedy(6))])["a"].token_ids
    again = run(cached, [("b", prompt, greedy(6))])["b"].token_ids
    assert cached.scheduler.prefix_cache_hits > 0 and list(first) == list(again) == list(want)
    spec = make_engine(untied, kv_cache_dtype="fp8", enable_prefix_caching=False,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                           "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    assert list(run(spec, [("c", prompt, greedy(6))])["c"].token_ids) == list(want)
