"""The rotary layer (``get_rope``) against transformers' rotary modules, fp32 on CPU:
every rope type's cos/sin table, positions past original_max_position_embeddings,
dynamic NTK and longrope per position, partial rotary (Phi-3), the interleaved layout
(DeepSeek-V2/V3 application), legacy ``rope_scaling`` / ``rope_theta`` configs, table
sharing, refusals, and DeepSeek's YaRN softmax scale."""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from core_runner.layers import get_rope, rope_theta_of, yarn_softmax_scale
from core_runner.layers.rope_config import rope_parameters_of

HEAD = 16
LLAMA = dict(hidden_size=64, num_attention_heads=4, head_dim=HEAD, max_position_embeddings=256)
ORIG = 64  # original_max_position_embeddings of the scaled configs: positions 64..255 are past it
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                    "beta_fast": 16, "beta_slow": 2, "mscale": 1.2, "mscale_all_dim": 0.6},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG,
                              "attention_factor": 0.8},
    "llama3": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIG},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": ORIG,
                 "short_factor": [1.0 + 0.1 * i for i in range(HEAD // 2)],
                 "long_factor": [2.0 + 0.7 * i for i in range(HEAD // 2)]},
}


def llama_config(name: str, theta: float = 10000.0) -> transformers.LlamaConfig:
    scaling = SCALINGS[name]
    extra = {"rope_scaling": dict(scaling, rope_theta=theta)} if scaling else {"rope_theta": theta}
    return transformers.LlamaConfig(**LLAMA, **extra)


def hf_cos_sin(module, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, rotary_dim / 2] of one transformers forward over positions 0..length-1."""
    cos, sin = module(torch.zeros(1), torch.arange(length)[None])
    half = cos.shape[-1] // 2
    assert torch.equal(cos[..., :half], cos[..., half:])  # transformers' cat(freqs, freqs)
    return cos[0, :, :half], sin[0, :, :half]


def split(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return table.chunk(2, dim=-1)


@pytest.mark.parametrize("name", [n for n in SCALINGS if n not in ("dynamic", "longrope")])
def test_table_equals_transformers(name):
    cfg = llama_config(name, theta=5000.0)
    rope = get_rope(cfg, HEAD)
    assert rope.cos_sin.shape == (256, HEAD) and rope.cos_sin.dtype == torch.float32
    cos, sin = hf_cos_sin(LlamaRotaryEmbedding(cfg), 256)
    mine_cos, mine_sin = split(rope.cos_sin)
    torch.testing.assert_close(mine_cos, cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(mine_sin, sin, atol=1e-6, rtol=0)


def test_scaled_tables_differ_from_default():
    """Each scaled type changes the table (so the equality above is not vacuous; dynamic
    NTK equals default up to max_position_embeddings by design), and the attention factor
    reaches cos/sin."""
    plain = get_rope(llama_config("default"), HEAD).cos_sin
    for name in SCALINGS:
        if name not in ("default", "dynamic"):
            assert (get_rope(llama_config(name), HEAD).cos_sin - plain).abs().max() > 1e-2, name
    attn = get_rope(llama_config("yarn-attention-factor"), HEAD).cos_sin
    assert torch.allclose(attn[0, : HEAD // 2], torch.full((HEAD // 2,), 0.8))


def dynamic_ntk_float64(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Angles [length, HEAD / 2] and cos|sin of transformers' dynamic NTK formula for a sequence of
    ``length`` (``llama_config("dynamic")``: theta 10000, factor 4), evaluated in float64."""
    factor, max_pos = 4.0, LLAMA["max_position_embeddings"]
    base = 10000.0 * (factor * max(length, max_pos) / max_pos - (factor - 1)) ** (HEAD / (HEAD - 2))
    inv_freq = base ** -(torch.arange(0, HEAD, 2, dtype=torch.float64) / HEAD)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq
    return angles, torch.cat([angles.cos(), angles.sin()], dim=-1)


def assert_float32_rounding_of(table: torch.Tensor, angles: torch.Tensor, exact: torch.Tensor) -> None:
    """``table`` (float32 cos|sin) is ``exact`` up to what float32 can hold. Two float32 pows give the
    inverse frequency to a few ulp and the product with the position rounds once more, so the angle
    is off by up to ~2 eps x angle (up to ~1e-5 rad at position 400) before cos/sin add ~1 eps."""
    eps = torch.finfo(torch.float32).eps
    bound = eps * (2 * torch.cat([angles, angles], dim=-1) + 1)
    excess = (table.double() - exact).abs() - bound
    assert excess.max() <= 0, f"off by {excess.max().item():.3g} beyond float32 rounding at {excess.argmax().item()}"


def test_dynamic_ntk_per_position():
    """Up to max_position_embeddings: transformers' table for any such length (unscaled).
    Past it (a longer table): row p is what transformers computes for a sequence of p + 1.

    Past max_position_embeddings the rows are compared with the formula in float64, not with
    transformers' float32 table at a fixed tolerance: the angle p x inv_freq (up to 399 rad here)
    holds only ~1e-5 rad in float32, and the two sides round differently (ours evaluates every
    length in one batched pow, transformers one length at a time; which elements torch computes in
    SIMD and which in scalar code depends on the tensor's size and the CPU's instruction set, so the
    same row can differ by 1.5e-5 in sin on an AVX2 machine and agree bit for bit on an AVX-512 one).
    Both sides are checked against the same float32 rounding bound: neither is the less accurate."""
    cfg = llama_config("dynamic")
    rope = get_rope(cfg, HEAD, max_position=400)
    mine_cos, mine_sin = split(rope.cos_sin)
    cos, sin = hf_cos_sin(LlamaRotaryEmbedding(cfg), 256)
    torch.testing.assert_close(mine_cos[:256], cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(mine_sin[:256], sin, atol=1e-6, rtol=0)
    for p in range(256, 400):
        angles, exact = dynamic_ntk_float64(p + 1)
        assert_float32_rounding_of(rope.cos_sin[p], angles[p], exact[p])
    for p in (256, 300, 334, 399):
        theirs = torch.cat(hf_cos_sin(LlamaRotaryEmbedding(cfg), p + 1), dim=-1)[p]
        angles, exact = dynamic_ntk_float64(p + 1)
        assert_float32_rounding_of(theirs, angles[p], exact[p])
    assert (mine_cos[300] - hf_cos_sin(LlamaRotaryEmbedding(cfg), 256)[0][-1]).abs().max() > 1e-3


def test_longrope_short_then_long_factors():
    cfg = llama_config("longrope")
    mine_cos, mine_sin = split(get_rope(cfg, HEAD).cos_sin)
    short_cos, short_sin = hf_cos_sin(LlamaRotaryEmbedding(cfg), ORIG)  # within the original length
    long_cos, long_sin = hf_cos_sin(LlamaRotaryEmbedding(cfg), 256)  # past it: long factors everywhere
    torch.testing.assert_close(mine_cos[:ORIG], short_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(mine_sin[:ORIG], short_sin, atol=1e-6, rtol=0)
    torch.testing.assert_close(mine_cos[ORIG:], long_cos[ORIG:], atol=1e-6, rtol=0)
    torch.testing.assert_close(mine_sin[ORIG:], long_sin[ORIG:], atol=1e-6, rtol=0)
    assert (short_cos[1:] - long_cos[1:ORIG]).abs().max() > 1e-2  # the two factor sets differ


@pytest.mark.parametrize("scaling", ["default", "longrope"])
def test_partial_rotary_matches_phi3(scaling):
    """Phi-3 ropes the first head_dim * partial_rotary_factor features, the rest pass through."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    rope_params = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    if scaling == "longrope":
        rope_params.update(rope_type="longrope", original_max_position_embeddings=ORIG,
                           short_factor=[1.0 + 0.2 * i for i in range(4)], long_factor=[3.0 + i for i in range(4)])
    cfg = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=256, rope_parameters=rope_params)
    rope = get_rope(cfg, HEAD)
    assert rope.rotary_dim == HEAD // 2
    g = torch.Generator().manual_seed(0)
    length = 200
    q, k = torch.randn(length, 4, HEAD, generator=g), torch.randn(length, 2, HEAD, generator=g)
    positions = torch.arange(length)
    cos, sin = Phi3RotaryEmbedding(cfg)(q, positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_out, k_out = rope(positions, q, k)
    if scaling == "longrope":  # transformers ropes a 200-token forward with long factors throughout
        q_ref, k_ref, q_out, k_out = q_ref[..., ORIG:, :], k_ref[..., ORIG:, :], q_out[ORIG:], k_out[ORIG:]
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    assert torch.equal(q_out[..., HEAD // 2:], q[-q_out.shape[0]:, :, HEAD // 2:])


DEEPSEEK = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, vocab_size=64, num_hidden_layers=1,
                max_position_embeddings=163840)
V2_LITE_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
POSITIONS = torch.tensor([0, 1, 17, 4095, 4096, 5000, 100_000, 163_839])


def _pe(seed: int, heads: int = 4, dim: int = 8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(POSITIONS), heads, dim, generator=g), torch.randn(len(POSITIONS), dim, generator=g)


@pytest.mark.parametrize("scaling", [None, V2_LITE_YARN])
def test_interleaved_matches_deepseek_v2(scaling):
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as ds

    cfg = transformers.DeepseekV2Config(**DEEPSEEK, rope_scaling=dict(scaling) if scaling else None)
    rope = get_rope(cfg, 8, is_neox_style=False)
    q, k = _pe(1)
    freqs_cis = ds.DeepseekV2RotaryEmbedding(cfg)(q, POSITIONS[None])
    q_ref, k_ref = ds.apply_rotary_emb(q.transpose(0, 1)[None], k[None, None], freqs_cis)
    q_out, k_out = rope(POSITIONS, q, k)
    assert k_out.shape == k.shape
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref[0, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleave", [True, False])
def test_deepseek_v3_layouts(interleave):
    """V3 rotates interleaved pairs but writes them de-interleaved ([evens | odds]); the
    layer keeps them interleaved: the same values in another order, q and k alike."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    cfg = transformers.DeepseekV3Config(**DEEPSEEK, rope_interleave=interleave, rope_scaling=dict(V2_LITE_YARN))
    rope = get_rope(cfg, 8, is_neox_style=not interleave)
    q, k = _pe(2)
    cos, sin = ds.DeepseekV3RotaryEmbedding(cfg)(q, POSITIONS[None])
    apply = ds.apply_rotary_pos_emb_interleave if interleave else ds.apply_rotary_pos_emb
    q_ref, k_ref = apply(q.transpose(0, 1)[None], k[None, None], cos, sin)
    q_out, k_out = rope(POSITIONS, q, k)
    if interleave:
        q_out = torch.cat([q_out[..., 0::2], q_out[..., 1::2]], dim=-1)
        k_out = torch.cat([k_out[..., 0::2], k_out[..., 1::2]], dim=-1)
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref[0, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("version", ["V2", "V3"])
@pytest.mark.parametrize("scaling", [None, V2_LITE_YARN, {"type": "yarn", "factor": 8.0, "mscale_all_dim": 1.0,
                                                          "original_max_position_embeddings": 4096},
                                     {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}])
def test_yarn_softmax_scale_matches_deepseek_attention(version, scaling):
    cfg = getattr(transformers, f"Deepseek{version}Config")(**DEEPSEEK, rope_scaling=dict(scaling) if scaling else None)
    attn = getattr(transformers.models, f"deepseek_{version.lower()}").__dict__[
        f"modeling_deepseek_{version.lower()}"].__dict__[f"Deepseek{version}Attention"](cfg, 0)
    mine = yarn_softmax_scale(cfg, 16 + 8)
    assert mine == pytest.approx(attn.scaling, rel=1e-12)
    if scaling and scaling.get("mscale_all_dim"):
        assert mine > 1.05 * 24 ** -0.5  # the correction is really applied
    else:
        assert mine == 24 ** -0.5


def test_legacy_and_new_config_forms_agree():
    """rope_parameters (transformers 5), legacy rope_scaling with 'type', and a bare
    rope_theta on a plain namespace give one table."""
    from types import SimpleNamespace

    params = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": ORIG}
    new = transformers.LlamaConfig(**LLAMA, rope_parameters={**params, "rope_theta": 500000.0})
    legacy = SimpleNamespace(**LLAMA, rope_theta=500000.0, rope_scaling={**params, "type": params["rope_type"]})
    del legacy.rope_scaling["rope_type"]
    assert torch.equal(get_rope(new, HEAD).cos_sin, get_rope(legacy, HEAD).cos_sin)
    plain = SimpleNamespace(**LLAMA, rope_theta=500000.0)
    assert rope_parameters_of(plain)["rope_type"] == "default" and rope_theta_of(plain) == 500000.0
    assert rope_theta_of(new) == 500000.0  # a scaled config still has a base
    cos, _ = hf_cos_sin(LlamaRotaryEmbedding(transformers.LlamaConfig(**LLAMA, rope_theta=500000.0)), 256)
    torch.testing.assert_close(get_rope(plain, HEAD).cos_sin[:, : HEAD // 2], cos, atol=1e-6, rtol=0)


def test_equal_requests_share_one_table():
    a, b = get_rope(llama_config("llama3"), HEAD), get_rope(llama_config("llama3"), HEAD)
    assert a.cos_sin.data_ptr() == b.cos_sin.data_ptr()
    assert get_rope(llama_config("llama3", theta=500.0), HEAD).cos_sin.data_ptr() != a.cos_sin.data_ptr()
    assert get_rope(llama_config("llama3"), HEAD, max_position=128).cos_sin.shape == (128, HEAD)


@pytest.mark.parametrize("bad,match", [
    ({"rope_scaling": {"rope_type": "su", "factor": 2.0}}, "rope_type='su' is not supported: expected one of"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "nested by layer type"),
])
def test_refusals_name_the_value(bad, match):
    from types import SimpleNamespace

    cfg = SimpleNamespace(**LLAMA, layer_types=["full_attention"], **bad)
    with pytest.raises(ValueError, match=match):
        get_rope(cfg, HEAD)


def test_nested_rope_parameters_by_layer_type():
    from types import SimpleNamespace

    cfg = SimpleNamespace(**LLAMA, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    full = get_rope(cfg, HEAD, layer_type="full_attention").cos_sin
    sliding = get_rope(cfg, HEAD, layer_type="sliding_attention").cos_sin
    torch.testing.assert_close(full[2], sliding[1])  # linear factor 2: position 2 ropes as 1
    with pytest.raises(ValueError, match="layer_type='global' has no entry"):
        get_rope(cfg, HEAD, layer_type="global")
