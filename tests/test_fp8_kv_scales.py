"""Checkpoint fp8 KV cache scales (docs/fp8_kv_cache.md): the names the loader reads, what it
refuses, and that the scales reach the cache (a scale of 2.0 stores half the value and reads it
back doubled: the same logits as 1.0; a large scale pushes entries into fp8's subnormals: worse)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from checkpoint_surgery import edit_tensors
from helpers import Checkpoint, make_engine, random_prompts

from core_runner.conformance.harness import Recorder, greedy, run
from core_runner.loader import CheckpointError

LAYERS = 2  # the tiny Qwen3 of tests/helpers.py


def _with_scales(src, dst, scales: dict[str, float]):
    def edit(t):
        for name, value in scales.items():
            t[name] = torch.tensor(value, dtype=torch.float32)
    return edit_tensors(src.path, dst, edit)


def _every_layer(suffix: str, value: float) -> dict[str, float]:
    return {f"model.layers.{i}.self_attn.{suffix}": value for i in range(LAYERS)}


def _logits_and_caches(path, prompts, **opts):
    e = make_engine(Checkpoint("scaled", str(path), None), **opts)
    rec = Recorder(e)
    out = run(e, [(f"r{i}", p, greedy(3)) for i, p in enumerate(prompts)])
    logits = torch.stack([lg for i in range(len(prompts)) for lg in rec.sampling_logits(f"r{i}", len(prompts[i]))])
    return logits.float(), e.debug.paged_caches(), [list(out[f"r{i}"].token_ids) for i in range(len(prompts))], e


@pytest.fixture(scope="module")
def prompts():
    return random_prompts([9, 6], seed=11)


def test_scale_two_halves_the_entries_and_keeps_the_logits(untied, tmp_path, prompts):
    assert f"model.layers.{LAYERS}.self_attn.q_proj.weight" not in _names(untied.path)
    assert f"model.layers.{LAYERS - 1}.self_attn.q_proj.weight" in _names(untied.path)
    two = _with_scales(untied, tmp_path / "two", {**_every_layer("k_scale", 2.0), **_every_layer("v_scale", 2.0)})
    one = _with_scales(untied, tmp_path / "one", _every_layer("kv_scale", 1.0))
    big = _with_scales(untied, tmp_path / "big", _every_layer("kv_scale", 256.0))
    got = {n: _logits_and_caches(p, prompts, kv_cache_dtype="fp8", enable_prefix_caching=False)
           for n, p in (("one", one), ("two", two), ("big", big))}
    e = got["two"][3]
    layers = [m for m in e.runner.model.modules() if hasattr(m, "kv_scale_loaded")]
    assert len(layers) == LAYERS and all(m.kv_scale.tolist() == [2.0, 2.0] for m in layers)
    for i, name in enumerate(sorted(got["one"][1])):
        a, b = got["one"][1][name].float(), got["two"][1][name].float()
        # fp8 rounding is scale-free for a power of two: entry(x / 2) * 2 == entry(x) away from
        # the subnormals (below 2**-6) that dividing by 2 reaches first
        normal = a.abs() >= 2 ** -5
        same = (b[normal] * 2 == a[normal]).float().mean().item()
        assert normal.sum() > 0.5 * (a != 0).sum() and not torch.equal(a, b)
        # layer 0's K/V come from the embeddings alone: exact; later layers see the subnormals' changes
        assert same == 1.0 if i == 0 else same > 0.9
    a, b, c = got["one"][0], got["two"][0], got["big"][0]
    spread = (a.amax(-1) - a.amin(-1))
    err_two = ((a - b).abs().amax(-1) / spread).max().item()
    err_big = ((a - c).abs().amax(-1) / spread).max().item()
    assert err_two < 0.01 < err_big, (err_two, err_big)  # 256 leaves most entries subnormal or zero


def test_k_and_v_scales_are_separate_and_per_layer(untied, tmp_path, prompts):
    path = _with_scales(untied, tmp_path / "kv", {"model.layers.0.self_attn.k_proj.output_scale": 4.0,
                                                  "model.layers.0.self_attn.v_proj.output_scale": 0.5,
                                                  "model.layers.1.self_attn.k_scale": 8.0})
    ref = _logits_and_caches(untied.path, prompts, kv_cache_dtype="fp8", enable_prefix_caching=False)
    got = _logits_and_caches(path, prompts, kv_cache_dtype="fp8", enable_prefix_caching=False)
    scales = [m.kv_scale.tolist() for m in got[3].runner.model.modules() if hasattr(m, "kv_scale_loaded")]
    assert scales == [[4.0, 0.5], [8.0, 1.0]]
    names = sorted(got[1])
    for i, (layer, (ks, vs)) in enumerate(zip(names, scales)):
        a, b = ref[1][layer].float(), got[1][layer].float()
        for part, s in ((0, ks), (1, vs)):
            # entries that stay normal fp8 numbers after the division (power-of-two scales: exact)
            normal = a[part].abs() >= 2 ** -5 * max(s, 1.0)
            same = (b[part][normal] * s == a[part][normal]).float().mean().item()
            assert normal.sum() > 0.5 * (a[part] != 0).sum()
            assert same == 1.0 if i == 0 else same > 0.9  # layer 1 sees layer 0's fp8 changes


def test_auto_cache_ignores_the_scales_with_a_log_line(untied, tmp_path, prompts, caplog):
    path = _with_scales(untied, tmp_path / "s", _every_layer("kv_scale", 256.0))
    with caplog.at_level(logging.INFO, logger="core_runner.kv_cache_dtype"):
        got = _logits_and_caches(path, prompts)
    assert "KV cache scales of 2 layer(s) are ignored: kv_cache_dtype='auto'" in caplog.text
    want = _logits_and_caches(untied.path, prompts)
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("scales,match", [
    ({"model.layers.0.self_attn.k_scale": torch.ones(2)}, r"k_scale'.*one positive finite number.*shape \(2,\)"),
    ({"model.layers.0.self_attn.v_scale": torch.tensor(0.0)}, r"v_scale'.*one positive finite number.*value 0.0"),
    ({"model.layers.0.self_attn.kv_scale": torch.tensor(2.0), "model.layers.0.self_attn.k_scale": torch.tensor(2.0)},
     r"both set the k cache scale of 'model.layers.0.self_attn.attn'"),
    ({"model.layers.0.mlp.k_scale": torch.tensor(2.0)}, r"mlp.k_scale'.*scale for 'model.layers.0.mlp'.*no attention"),
    ({"model.layers.0.self_attn.qkv_proj.k_scale": torch.tensor(2.0)}, r"no attention layer"),
])
def test_bad_scales_are_refused_naming_the_tensor(untied, tmp_path, scales, match):
    def edit(t):
        t.update(scales)
    path = edit_tensors(untied.path, tmp_path / "bad", edit)

    ckpt = Checkpoint("scaled", str(path), None)
    with pytest.raises(CheckpointError, match=match):
        make_engine(ckpt, kv_cache_dtype="fp8")


def _names(path):
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def test_scaled_fp8_cache_with_prefix_hits_and_ngram_speculation(untied, tmp_path):
    """Prefix caching on = off (hits read the first request's scaled fp8 blocks) and n-gram
    speculation = plain decoding, over an fp8 cache with non-unit, non-power-of-two scales."""
    path = _with_scales(untied, tmp_path / "s", {"model.layers.0.self_attn.k_scale": 1.5,
                                                 "model.layers.0.self_attn.v_scale": 0.3,
                                                 "model.layers.1.self_attn.kv_scale": 3.0})

    ckpt = Checkpoint("scaled", str(path), None)
    prompt = (random_prompts([6], seed=5)[0] * 3)[:16]  # repeats: the n-gram proposer finds matches
    plain = make_engine(ckpt, kv_cache_dtype="fp8", enable_prefix_caching=False)
    rec = Recorder(plain)
    want = list(run(plain, [("a", prompt, greedy(6))])["a"].token_ids)
    want_logits = torch.stack(rec.sampling_logits("a", len(prompt))).float()
    cached = make_engine(ckpt, kv_cache_dtype="fp8")
    first = list(run(cached, [("a", prompt, greedy(6))])["a"].token_ids)
    rec = Recorder(cached)
    again = list(run(cached, [("b", prompt, greedy(6))])["b"].token_ids)
    hit_logits = torch.stack(rec.sampling_logits("b", len(prompt))).float()
    assert cached.scheduler.prefix_cache_hits > 0 and first == again == want
    spread = want_logits.amax(-1) - want_logits.amin(-1)
    assert ((hit_logits - want_logits).abs().amax(-1) / spread).max() < 1e-3  # the same fp8 entries, re-read
    spec = make_engine(ckpt, kv_cache_dtype="fp8", enable_prefix_caching=False,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                           "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    assert list(run(spec, [("c", prompt, greedy(6))])["c"].token_ids) == want
    assert spec.scheduler.spec_num_accepted_tokens > 0  # the proposals were used, not all rejected


def test_backend_without_kv_scales_is_refused_for_an_fp8_cache(untied):
    from core_runner.attention.registry import register_backend, unregister_backend
    from core_runner.attention.torch_backend import TorchPagedAttention
    from core_runner.oracle import UnsupportedError

    class NoScales(TorchPagedAttention):
        name = "no_scales"
        supports_kv_scales = False

    register_backend("no_scales", NoScales)
    try:
        with pytest.raises(UnsupportedError, match=r"kv_cache_dtype='fp8' needs an attention backend with "
                                                   r"supports_kv_scales=True.*'no_scales'.*'torch' or 'triton'"):
            make_engine(untied, kv_cache_dtype="fp8", attention_backend="no_scales")
        assert make_engine(untied, attention_backend="no_scales").num_blocks > 0  # a model-dtype cache is fine
    finally:
        unregister_backend("no_scales")


def test_compressed_tensors_kv_cache_scheme_static_fp8_accepted_others_refused():
    from core_runner.conformance.quantized import compressed_tensors_fp8_config
    from core_runner.quantization import quantization_from_config

    def cfg(**kv):
        qc = compressed_tensors_fp8_config()
        qc["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                 "symmetric": True, **kv}
        return type("C", (), {"quantization_config": qc})()

    assert quantization_from_config(cfg()) is not None  # its scales: k_proj / v_proj output_scale
    for bad in (dict(dynamic=True), dict(type="int"), dict(strategy="channel")):
        with pytest.raises(ValueError, match=r"kv_cache_scheme=.*static per-tensor fp8 KV cache scales"):
            quantization_from_config(cfg(**bad))
