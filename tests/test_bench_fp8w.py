"""CPU smoke test of the fp8w bench stage (benchmarks/fp8w_bench.py) and of dummy loading
for a quantized config: resident float8_e4m3fn weights with positive block scales."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import fp8w_bench
from core_runner.bench.shapes import QWEN3_FP8_QUANTIZATION, config_only_checkpoint, shape_config
from core_runner.loader.dummy import RANGE, _kept_dense


def test_qwen3_fp8_shape_is_the_dense_shape_with_block_fp8():
    dense, fp8 = shape_config("qwen3-0.6b").to_dict(), shape_config("qwen3-0.6b-fp8").to_dict()
    assert fp8.pop("quantization_config")["weight_block_size"] == [128, 128]
    dense.pop("quantization_config", None)
    assert fp8 == dense


def test_dummy_loading_builds_resident_fp8_weights(tmp_path, single_torch_thread):
    from core_runner import LLM
    from core_runner.quantization.fp8 import dequantize_fp8_block

    path = config_only_checkpoint("qwen3-0.6b-fp8", tmp_path, **fp8w_bench.TINY, quantization_config={
        **QWEN3_FP8_QUANTIZATION, "weight_block_size": [16, 16]})
    llm = LLM(path, device="cpu", dtype="float32", load_format="dummy", max_model_len=64, max_num_seqs=2,
              num_kv_blocks=16)
    mods = {n: m for n, m in llm.engine.model.named_modules() if getattr(m, "fp8_block", None) is not None}
    assert len(mods) == 4 * 2  # qkv, o, gate_up, down in each of 2 layers
    for name, m in mods.items():
        assert m.weight.dtype == torch.float8_e4m3fn, name
        scale = m.weight_scale_inv
        assert scale.dtype == torch.float32 and bool((scale > 0).all()), name
        assert m.weight.float().abs().amax() == 448.0  # each block quantized over the whole e4m3 range
        w = dequantize_fp8_block(m.weight, scale, (16, 16))
        assert 0 < float(w.abs().max()) <= RANGE and float(w.std()) > RANGE / 4
    out = llm.generate([[5, 6, 7]], use_tqdm=False)[0]
    assert len(out.token_ids) > 0


def test_routers_and_modules_to_not_convert_stay_dense():
    assert _kept_dense("model.layers.3.mlp.gate", []) and _kept_dense("model.layers.0.block.router", [])
    assert not _kept_dense("model.layers.3.mlp.gate_up_proj", [])
    assert _kept_dense("lm_head", ["lm_head"]) and _kept_dense("model.layers.1.self_attn.o_proj", ["re:.*o_proj$"])
    assert not _kept_dense("model.layers.1.self_attn.qkv_proj", ["lm_head", "re:.*o_proj$"])


def test_fp8w_stage_runs_and_reports(tmp_path, single_torch_thread):
    out = tmp_path / "fp8w.json"
    fp8w_bench.main(["--device", "cpu", "--dtype", "float32", "--tiny", "--num-requests", "3", "--scale", "64",
                     "--root", str(tmp_path), "--json", str(out)])
    res = json.loads(out.read_text())
    assert set(res) == {"bf16", "fp8w", "fp8kv", "fp8_resident", "ratios"}
    assert set(res["bf16"]) == set(res["fp8w"]) == {"_engine", "W1", "W2"} and set(res["fp8kv"]) == {"_engine", "W1"}
    for part in ("bf16", "fp8w", "fp8kv"):
        assert all(r["output_tok_s"] > 0 for k, r in res[part].items() if k != "_engine")
    assert res["fp8kv"]["_engine"]["kv_cache_dtype"] == "fp8" and res["bf16"]["_engine"]["fp8"]["fp8_modules"] == {}
    fp8 = res["fp8_resident"]
    assert set(fp8["fp8_modules"]) == {f"model.layers.*.{m}" for m in ("self_attn.qkv_proj", "self_attn.o_proj",
                                                                        "mlp.gate_up_proj", "mlp.down_proj")}
    assert fp8["parameter_dtypes"].get("float8_e4m3fn", 0) == 8 and fp8["fp8_scale_bytes"] > 0
    assert set(res["ratios"]) == {"fp8w_W1", "fp8w_W2", "fp8kv_W1"}
    assert all(r["tok_s"] > 0 for r in res["ratios"].values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8w_stage_on_cuda(tmp_path):
    res = fp8w_bench.main(["--tiny", "--num-requests", "16", "--scale", "8", "--root", str(tmp_path)])
    assert res["fp8w"]["W1"]["roofline_tok_s"] > 0 and res["ratios"]["fp8kv_W1"]["tok_s"] > 0


def test_a_variant_frees_its_engine_before_handing_memory_back(tmp_path, single_torch_thread):
    """Each variant's engine is dead when its memory is handed back (gc + the CUDA cache), so
    the next variant sizes its KV pool from memory that is really free (handing it back while
    the engine lived left the first variant's pool cached and none for the second)."""
    import weakref

    from core_runner.bench import variants

    built, dead_at_free = [], []
    real_build, real_free = variants.build_llm, variants.free_memory
    path = config_only_checkpoint("qwen3-0.6b", tmp_path, **fp8w_bench.TINY)
    args = variants.variant_args(device="cpu", dtype="float32", num_requests=2, scale=64)
    try:
        variants.build_llm = lambda *a, **kw: built.append(weakref.ref(llm := real_build(*a, **kw))) or llm
        variants.free_memory = lambda: dead_at_free.append(built[-1]() is None) or real_free()
        variants.run_variant(path, ["W1"], args, num_kv_blocks=32, max_num_seqs=2, max_model_len=256)
    finally:
        variants.build_llm, variants.free_memory = real_build, real_free
    assert len(built) == 1 and dead_at_free == [True]
