"""fp8 block-quantized checkpoints in DeepSeek-V3's format (quant_method 'fp8').

A tiny DeepseekV3 is written the way DeepSeek ships V3: every projection (attention,
dense MLP, shared and routed experts) as float8_e4m3fn plus ``<name>_scale_inv`` per
[b0, b1] block (scale_inv = amax / 448), with embeddings, norms, the router gate and
lm_head left in float32. Weights and their scales are spread over two shard files, so
some pairs sit in different files. transformers' DeepseekV3ForCausalLM loaded with the
dequantized weights (the same values) is the reference for logits and greedy tokens.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    Checkpoint,
    Recorder,
    assert_logits_match_hf,
    greedy,
    hf_greedy,
    make_engine,
    random_prompts,
    read_checkpoint,
    run,
)
from safetensors.torch import load_file, save_file

from core_runner.quantization import (
    Fp8BlockQuantization,
    dequantize_fp8_block,
    quantization_from_config,
    quantize_fp8_block,
)

CONFIG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=24, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
    first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
    max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.12, tie_word_embeddings=False,
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
# non-square, and q_lora_rank 48 (columns of q_b_proj) / kv_a out 40 leave partial blocks; gate and up
# (fused in one fp8 weight) start on a block: 48 rows each
BLOCK = (16, 32)
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)}
# DeepSeek-V3 leaves these unquantized (transformers: modules_to_not_convert ["lm_head"], the
# router is not an nn.Linear, norms and embeddings are not Linear at all)
UNQUANTIZED = re.compile(r"(embed_tokens|lm_head|norm|layernorm|mlp\.gate)\.weight$|e_score_correction_bias$")


def _dequant_by_blocks(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The test's own dequantization, block by block, independent of the library's."""
    out = q.float()
    for bi in range(scale.shape[0]):
        for bj in range(scale.shape[1]):
            out[bi * BLOCK[0]:(bi + 1) * BLOCK[0], bj * BLOCK[1]:(bj + 1) * BLOCK[1]] *= scale[bi, bj]
    return out


def _write_shards(path: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """Two shards; weight i goes to shard i % 2 and its scale to the other one."""
    path.mkdir(parents=True)
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    names = sorted(n for n in tensors if not n.endswith("_scale_inv"))
    for i, name in enumerate(names):
        shards[i % 2][name] = tensors[name]
        if name + "_scale_inv" in tensors:
            shards[(i + 1) % 2][name + "_scale_inv"] = tensors[name + "_scale_inv"]
    files = [f"model-0000{i + 1}-of-00002.safetensors" for i in range(2)]
    weight_map = {}
    for file, shard in zip(files, shards, strict=True):
        save_file({k: v.contiguous() for k, v in shard.items()}, str(path / file))
        weight_map.update({k: file for k in shard})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config))


def build_fp8(root: Path) -> tuple[Checkpoint, dict[str, torch.Tensor]]:
    import transformers

    torch.manual_seed(7)
    src = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**CONFIG)).to(torch.float32).eval()
    for layer in src.model.layers:  # a random correction bias changes which experts are chosen
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            gate.e_score_correction_bias.copy_(torch.randn_like(gate.e_score_correction_bias) * 0.3)
    src.save_pretrained(str(root / "src"))
    config = json.loads((root / "src" / "config.json").read_text())
    original = read_checkpoint(root / "src")
    fp8, dequantized = {}, {}
    for name, w in original.items():
        if UNQUANTIZED.search(name) or w.dim() != 2:
            fp8[name] = dequantized[name] = w
            continue
        q, scale = quantize_fp8_block(w, BLOCK)
        fp8[name], fp8[name + "_scale_inv"] = q, scale
        dequantized[name] = _dequant_by_blocks(q, scale)
    _write_shards(root / "fp8", fp8, {**config, "quantization_config": QUANT})
    _write_shards(root / "deq", dequantized, config)
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(str(root / "deq"), dtype=torch.float32).eval()
    return Checkpoint(name="deepseek-v3-fp8", path=str(root / "fp8"), hf=hf), fp8


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory, single_torch_thread):
    return build_fp8(tmp_path_factory.mktemp("fp8"))


def _variant(ckpt: Checkpoint, tmp_path: Path, edit_tensors=None, edit_config=None) -> Checkpoint:
    """A copy of the fp8 checkpoint with some tensors or config fields changed."""
    dst = tmp_path / "variant"
    shutil.copytree(ckpt.path, dst)
    if edit_tensors is not None:
        for file in dst.glob("*.safetensors"):
            tensors = load_file(str(file))
            edit_tensors(tensors)
            save_file(tensors, str(file))
    if edit_config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        edit_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return Checkpoint(name="variant", path=str(dst), hf=None)


# ---------------------------------------------------------------------------------
# the checkpoint as written, and the engine against transformers
# ---------------------------------------------------------------------------------
def test_checkpoint_is_in_the_v3_format(fp8_ckpt):
    ckpt, tensors = fp8_ckpt
    scales = [n for n in tensors if n.endswith(".weight_scale_inv")]
    assert "model.layers.1.mlp.experts.7.down_proj.weight_scale_inv" in scales
    for n in scales:
        w = tensors[n.removesuffix("_scale_inv")]
        assert w.dtype == torch.float8_e4m3fn and tensors[n].dtype == torch.float32
        assert tensors[n].shape == (-(-w.shape[0] // BLOCK[0]), -(-w.shape[1] // BLOCK[1])), n
    for n in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight", "model.norm.weight",
              "model.layers.0.self_attn.kv_a_layernorm.weight"):
        assert tensors[n].dtype == torch.float32 and n + "_scale_inv" not in tensors
    # partial blocks on both axes are exercised
    assert tensors["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"].shape[0] % BLOCK[0]
    assert tensors["model.layers.0.self_attn.q_b_proj.weight"].shape[1] % BLOCK[1]
    # some pairs are split across the two shards
    index = json.loads((Path(ckpt.path) / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(index[n] != index[n.removesuffix("_scale_inv")] for n in scales)


def test_engine_params_hold_fp8_weights_and_their_scales(fp8_ckpt):
    from core_runner.layers.fp8_weight import dense_weight

    ckpt, tensors = fp8_ckpt
    engine = make_engine(ckpt)
    attn = engine.model.model.layers[0].self_attn
    for mod, name in ((attn.q_b_proj, "q_b_proj"), (attn.kv_a_proj_with_mqa, "kv_a_proj_with_mqa")):
        key = f"model.layers.0.self_attn.{name}.weight"
        assert mod.weight.dtype == torch.float8_e4m3fn, name  # resident: the checkpoint's bytes
        assert torch.equal(mod.weight.view(torch.uint8), tensors[key].view(torch.uint8)), name
        assert torch.equal(mod.weight_scale_inv, tensors[key + "_scale_inv"]), name
        want = _dequant_by_blocks(tensors[key], tensors[key + "_scale_inv"])
        assert torch.equal(dense_weight(mod), want), name
        # fp8 rounding moved the weight away from the float32 original: the test can tell them apart
        assert not torch.equal(want, tensors[key].float())
    # MLA absorbs kv_b_proj: dense, dequantized at load
    key = "model.layers.0.self_attn.kv_b_proj.weight"
    assert attn.kv_b_proj.weight.dtype == torch.float32
    assert torch.equal(attn.kv_b_proj.weight, _dequant_by_blocks(tensors[key], tensors[key + "_scale_inv"]))
    experts = engine.model.model.layers[1].mlp.experts
    assert experts.w13.weight.dtype == experts.w2.weight.dtype == torch.float8_e4m3fn
    key = "model.layers.1.mlp.experts.3.up_proj.weight"
    up = dense_weight(experts.w13)[3, 48:]
    assert torch.equal(up, _dequant_by_blocks(tensors[key], tensors[key + "_scale_inv"]))
    # the router is not quantized in the checkpoint: stays float32
    assert engine.model.model.layers[1].mlp.gate.weight.dtype == torch.float32


def test_logits_and_greedy_tokens_match_hf(fp8_ckpt):
    ckpt, _ = fp8_ckpt
    engine = make_engine(ckpt)
    rec = Recorder(engine)
    prompts = random_prompts([1, 7, 23, 40], seed=3)
    outs = run(engine, [(f"r{i}", p, greedy(8)) for i, p in enumerate(prompts)])
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= len(prompts) * 8
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"].token_ids == hf_greedy(ckpt, p, 8), f"r{i}"


# ---------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------
def test_missing_scale_is_refused_naming_both_tensors(fp8_ckpt, tmp_path):
    ckpt, _ = fp8_ckpt
    gone = "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"
    bad = _variant(ckpt, tmp_path, edit_tensors=lambda t: t.pop(gone, None))
    with pytest.raises(ValueError, match=re.escape(gone)) as e:
        make_engine(bad)
    assert "'model.layers.1.mlp.experts.3.up_proj.weight' is float8_e4m3fn" in str(e.value)


def test_scale_of_the_wrong_shape_is_refused(fp8_ckpt, tmp_path):
    ckpt, _ = fp8_ckpt
    key = "model.layers.0.self_attn.q_b_proj.weight_scale_inv"  # [96, 48] -> [6, 2]

    def edit(t):
        if key in t:
            t[key] = torch.ones(6, 3)

    with pytest.raises(ValueError) as e:
        make_engine(_variant(ckpt, tmp_path, edit_tensors=edit))
    msg = str(e.value)
    assert "q_b_proj.weight" in msg and "(6, 3)" in msg and "(96, 48)" in msg and "(6, 2)" in msg
    assert "[16, 32]" in msg


def test_unknown_quant_method_is_refused_at_construction(fp8_ckpt, tmp_path):
    ckpt, _ = fp8_ckpt
    bad = _variant(ckpt, tmp_path, edit_config=lambda c: c["quantization_config"].update(quant_method="gptq"))
    with pytest.raises(ValueError, match=r"quant_method='gptq' is not supported.*'fp8'"):
        make_engine(bad)


# ---------------------------------------------------------------------------------
# the config parser and the dequantization maths
# ---------------------------------------------------------------------------------
class _Cfg:
    def __init__(self, qc):
        self.quantization_config = qc


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes", None])
def test_unknown_methods_list_what_is_supported(method):
    with pytest.raises(ValueError, match=rf"quant_method={method!r} is not supported.*'fp8'.*weight_block_size"):
        quantization_from_config(_Cfg({"quant_method": method}))


@pytest.mark.parametrize("change, field", [
    ({"fmt": "e5m2"}, "fmt='e5m2'"),
    ({"activation_scheme": "static"}, "activation_scheme='static'"),
    ({"weight_block_size": None}, "no weight_block_size"),
    ({"weight_block_size": [128]}, "weight_block_size=[128]"),
    ({"weight_block_size": [128, 0]}, "weight_block_size=[128, 0]"),
    ({"scale_fmt": "e4m3"}, "scale_fmt='e4m3'"),
])
def test_unsupported_fp8_variants(change, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        quantization_from_config(_Cfg({**QUANT, **change}))


def test_parser_accepts_v3_and_hf_spellings():
    assert quantization_from_config(_Cfg(None)) is None
    assert quantization_from_config(object()) is None
    q = quantization_from_config(_Cfg({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                       "weight_block_size": [128, 128]}))
    assert isinstance(q, Fp8BlockQuantization) and q.block == (128, 128)
    # transformers' FineGrainedFP8Config writes no fmt
    q = quantization_from_config(_Cfg({"quant_method": "fp8", "weight_block_size": [64, 32]}))
    assert q.block == (64, 32)
    assert q.is_auxiliary("a.weight_scale_inv") and not q.is_auxiliary("a.weight")
    assert q.scale_name("model.x.weight") == "model.x.weight_scale_inv"


@pytest.mark.parametrize("shape, block", [((300, 200), (128, 128)), ((7, 5), (4, 2)), ((3, 33, 70), (16, 32))])
def test_dequantize_matches_an_elementwise_loop(shape, block):
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(*shape, generator=g) * 3
    q, scale = quantize_fp8_block(w, block)
    out = dequantize_fp8_block(q, scale, block)
    assert out.shape == w.shape and out.dtype == torch.float32
    flat_q, flat_s, flat_o = q.reshape(-1, *shape[-2:]), scale.reshape(-1, *scale.shape[-2:]), out.reshape(-1,
                                                                                                            *shape[-2:])
    for e in range(flat_q.shape[0]):
        for i in range(0, shape[-2], max(1, shape[-2] // 9)):
            for j in range(0, shape[-1], max(1, shape[-1] // 9)):
                want = flat_q[e, i, j].float() * flat_s[e, i // block[0], j // block[1]]
                assert flat_o[e, i, j] == want, (e, i, j)
    # every block's largest element maps to +-448: scale_inv = amax / 448
    assert q.float().abs().amax() == 448.0
    # e4m3 keeps 3 mantissa bits: relative error per element <= 2**-4, plus the flush of tiny values
    assert ((out - w).abs() <= w.abs() * 2 ** -4 + scale.amax() * 2 ** -9).all()
    bf = dequantize_fp8_block(q, scale, block, torch.bfloat16)
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, out.to(torch.bfloat16))


def test_prepare_passes_unquantized_tensors_and_refuses_mismatches():
    q = Fp8BlockQuantization((2, 2))
    w8, s = quantize_fp8_block(torch.randn(4, 4), (2, 2))
    store = {"a.weight_scale_inv": s, "n.weight": torch.ones(4)}
    norm = torch.ones(4)
    assert q.prepare("n.weight", norm, store.get, torch.float32) is norm
    assert q.prepare("a.weight", w8, store.get, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"'a\.weight' has a scale 'a\.weight_scale_inv' but dtype torch\.float32"):
        q.prepare("a.weight", w8.float(), store.get, torch.float32)
    with pytest.raises(ValueError, match=r"'b\.weight' is float8_e4m3fn but its scale 'b\.weight_scale_inv'"):
        q.prepare("b.weight", w8, store.get, torch.float32)


def test_family_without_the_capability_refuses_a_quantized_checkpoint(untied, tmp_path):
    """A family that declares no quantization:compressed-tensors (the Qwen3 plugin's model
    registered with fp8 only, tests/conformance_fixtures/quant_fp8_only.py): its checkpoint
    with such a quantization_config is refused before loading (and before the format is parsed)."""
    import importlib

    from core_runner.conformance.quantized import compressed_tensors_fp8_config
    from core_runner.oracle import UnsupportedError
    from core_runner.plugins import PluginManager

    pm = PluginManager()
    pm.register_module("quant_fp8_only", importlib.import_module("conformance_fixtures.quant_fp8_only"))
    qc = compressed_tensors_fp8_config()
    bad = _variant(untied, tmp_path, edit_config=lambda c: c.update(quantization_config=qc))
    with pytest.raises(UnsupportedError, match=r"quant_method='compressed-tensors'.*Qwen3ForCausalLM declares "
                                               r"quantization:compressed-tensors unsupported"):
        make_engine(bad, plugins=pm)


def test_deepseek_declares_fp8():
    from core_runner.plugins import load_plugins

    reg = load_plugins().registry.get("DeepseekV3ForCausalLM")
    assert reg.capability("quantization:fp8").supported
    assert load_plugins().registry.get("Qwen3ForCausalLM").capability("quantization:fp8").supported


def test_every_generate_family_declares_both_fp8_methods():
    from core_runner.plugins import load_plugins

    regs = [r for r in load_plugins().registry.registrations() if "generate" in r.tasks]
    assert len({r.plugin for r in regs}) >= 8, sorted({r.plugin for r in regs})
    for reg in regs:
        for cap in ("quantization:fp8", "quantization:compressed-tensors"):
            assert reg.capability(cap).supported, (reg.architecture, cap)
