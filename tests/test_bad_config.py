"""A checkpoint whose config.json (or sentence-transformers modules.json) cannot work is
refused when the engine is built, naming the file, the field and what would be valid;
never loaded to fail every request later, never a traceback in the CLI."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from core_runner import LLM, PoolingParams

OPTS = dict(dtype="float32", max_model_len=32, max_num_seqs=4, block_size=4, num_kv_blocks=32)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("badconfig")
    cfg = transformers.Qwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def edited(src: Path, dst: Path, edit) -> str:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))  # NaN and Infinity as Python's json writes them
    return str(dst)


def rope(**kw):
    return lambda c: c["rope_parameters"].update(kw)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(rms_norm_eps=float("nan")), r"rms_norm_eps=nan is invalid: expected a number, not NaN"),
    (lambda c: c.update(rms_norm_eps=-1e-6), r"rms_norm_eps=-1e-06 is invalid: expected a number > 0"),
    (lambda c: c.update(rms_norm_eps=0), r"rms_norm_eps=0 is invalid: expected a number > 0"),
    (rope(rope_theta=float("nan")), r"rope_parameters.rope_theta=nan is invalid"),
    (rope(rope_theta=0), r"rope_parameters.rope_theta=0 is invalid: expected a number > 0 \(the RoPE base\)"),
    (rope(rope_theta=float("inf")), r"rope_parameters.rope_theta=inf is invalid: expected a finite number"),
    (rope(rope_type="linear", factor=0.0), r"rope_parameters.factor=0.0 is invalid: expected a finite number > 0"),
    (lambda c: c.update(hidden_size=-32), r"hidden_size=-32 is invalid: expected an integer in \[1, 2\*\*31 - 1\]"),
    (lambda c: c.update(intermediate_size=0), r"intermediate_size=0 is invalid: expected an integer in \[1, "),
    (lambda c: c.update(vocab_size=True), r"vocab_size=True is invalid: expected an integer >= 1 \(a size\), not a "
                                          r"bool"),
    (lambda c: c.update(hidden_size=32.0), r"hidden_size=32.0 is invalid: expected an integer >= 1 \(a size\), not a "
                                           r"float"),
    (lambda c: c.update(num_key_value_heads=3, num_attention_heads=4),
     r"num_key_value_heads=3 does not divide num_attention_heads=4"),
    # absurd sizes: refused by the field, before transformers or torch allocate anything
    (lambda c: c.update(hidden_size=2**40), r"hidden_size=1099511627776 is invalid: expected an integer in \[1, "),
    (lambda c: c.update(num_hidden_layers=10**7), r"num_hidden_layers=10000000 is invalid: expected at most 10,000 "
                                                  r"layers"),
], ids=["eps-nan", "eps-negative", "eps-zero", "theta-nan", "theta-zero", "theta-inf", "rope-factor-zero",
        "hidden-negative", "intermediate-zero", "vocab-bool", "hidden-float", "kv-heads-divide", "hidden-2**40",
        "layers-10**7"])
def test_config_values_no_model_can_run_with_are_refused_at_load(tiny_ckpt, tmp_path, edit, match):
    path = edited(tiny_ckpt, tmp_path / "ckpt", edit)
    with pytest.raises(ValueError, match=rf"config.json: {match}"):
        LLM(path, **OPTS)


@pytest.mark.parametrize("edit, fields, how", [
    # ~12 TiB in one layer: the estimate is exact (the whole model built with fake tensors)
    (lambda c: c.update(hidden_size=2**20, intermediate_size=2**20),
     ("hidden_size=1048576", "intermediate_size=1048576"), "measured with fake tensors"),
    # 2,000 layers of 0.75 GiB: extrapolated from builds of 1 and 2 layers
    (lambda c: (c.pop("layer_types"), c.update(num_hidden_layers=2000, hidden_size=4096, intermediate_size=16384)),
     ("num_hidden_layers=2000", "hidden_size=4096"), "extrapolated from 1 and 2 layers"),
], ids=["wide", "deep"])
def test_weights_that_cannot_fit_are_refused_by_their_sizes_before_allocating(tiny_ckpt, tmp_path, edit, fields, how):
    path = edited(tiny_ckpt, tmp_path / "ckpt", edit)
    with pytest.raises(ValueError, match=r"the model's weights need [\d,.]+ GiB in float32 \((.*)\) but cpu has "
                                         r"[\d,.]+ GiB free: check config.json's sizes") as err:
        LLM(path, **OPTS)
    assert how in str(err.value) and all(f in str(err.value) for f in fields)
    assert "the largest tensor is model." in str(err.value)


def test_every_builtin_example_passes_and_is_estimated_exactly():
    """The built-in plugins' published configs pass the checks, and the estimate (fake
    tensors) equals the bytes of the real model's parameters and buffers."""
    from core_runner.conformance.reference import examples_of, reference_config
    from core_runner.loader import check_config_values, estimate_footprint
    from core_runner.plugins import load_plugins

    checked = 0
    for reg in load_plugins().registry.registrations():
        if reg.plugin not in ("qwen3", "deepseek", "granite_hybrid", "pooling", "llama_template"):
            continue
        cls = reg.load_model_class()
        for ex in examples_of(reg):
            cfg = reference_config(reg, ex)
            check_config_values(ex.config, f"{reg.architecture} {ex.name}")
            check_config_values(cfg, f"{reg.architecture} {ex.name}")
            fp = estimate_footprint(cls, cfg, torch.float32)
            assert fp is not None and not fp.extrapolated, (reg.architecture, ex.name)
            if fp.bytes < 4 << 20:  # the tiny ones: build them for real
                model = cls(cfg)
                real = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
                assert fp.bytes == real, (reg.architecture, ex.name)
            checked += 1
    assert checked >= 20


def test_the_estimate_leaves_nothing_fake_behind():
    """A model holding reference cycles (this fixture's bound forwards) outlives its estimate
    until the cyclic GC runs; a shared per-device cache (RoPE tables) must not hand its fake
    tensors to the real build that follows."""
    import gc

    from conformance_fixtures.offsets import QueryPositionsFromState
    from torch._subclasses.fake_tensor import FakeTensor

    from core_runner.loader import estimate_footprint

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    gc.disable()
    try:
        assert estimate_footprint(QueryPositionsFromState, cfg, torch.float32) is not None
        model = QueryPositionsFromState(cfg)
    finally:
        gc.enable()
    tensors = [v for m in model.modules() for v in [*vars(m).values(), *m._parameters.values(), *m._buffers.values()]
               if isinstance(v, torch.Tensor)]
    assert tensors and not any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors)


def test_a_missing_field_transformers_refuses_names_the_file_and_the_field(tiny_ckpt, tmp_path, capsys):
    from core_runner.cli import main

    path = edited(tiny_ckpt, tmp_path / "ckpt", lambda c: c.pop("num_hidden_layers"))
    with pytest.raises(ValueError, match=r"config.json: num_hidden_layers is missing from the file \(transformers "
                                         r"used its default\); transformers refused the config: .*layer_types"):
        LLM(path, **OPTS)
    rc = main(["generate", "--model", path, "--max-model-len", "16", "--num-kv-blocks", "8", "hello"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("core-runner: error: ") and err.count("\n") == 1, err
    assert f"{path}/config.json: num_hidden_layers is missing" in err and "Traceback" not in err


# ---- sentence-transformers modules.json ---------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tinybert")
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(path)
    return path


def st_checkpoint(src: Path, dst: Path, pooling_path: str, mode: str | None = "pooling_mode_cls_token",
                  pooling_text: str | None = None) -> str:
    shutil.copytree(src, dst)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": pooling_path, "type": "sentence_transformers.models.Pooling"}]
    (dst / "modules.json").write_text(json.dumps(modules))
    target = (dst / pooling_path) if not pooling_path.startswith("/") else Path(pooling_path)
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(pooling_text if pooling_text is not None else json.dumps({mode: True}))
    return str(dst)


def embed_opts() -> dict:
    return dict(dtype="float32", max_model_len=32, max_num_seqs=2, num_kv_blocks=16)


def test_pooling_config_is_read_inside_the_checkpoint(tiny_bert, tmp_path):
    llm = LLM(st_checkpoint(tiny_bert, tmp_path / "a", "./1_Pooling/"), **embed_opts())
    assert llm.engine.model_state.default_pooling_type == "cls"
    llm = LLM(st_checkpoint(tiny_bert, tmp_path / "b", "1_Pooling", "pooling_mode_max_tokens"), **embed_opts())
    with pytest.raises(ValueError, match=r"prompt 0: .*1_Pooling/config.json: sentence-transformers pooling "
                                         r"\['pooling_mode_max_tokens'\] is not implemented"):
        llm.embed([[1, 2, 3]], use_tqdm=False)  # a mode left out fails only the requests relying on it
    assert len(llm.embed([[1, 2, 3]], PoolingParams(pooling_type="mean"), use_tqdm=False)[0].outputs.embedding) == 16


@pytest.mark.parametrize("where", ["../outside", "1_Pooling/../../outside", "ABS"])
def test_a_module_path_leaving_the_checkpoint_is_refused_at_load(tiny_bert, tmp_path, where):
    where = str(tmp_path / "elsewhere") if where == "ABS" else where
    path = st_checkpoint(tiny_bert, tmp_path / "ckpt", where)
    with pytest.raises(ValueError, match=rf"ckpt/modules.json: module '1' has path '{where}', which leaves the "
                                         r"checkpoint directory .*; expected a relative path inside it"):
        LLM(path, **embed_opts())


@pytest.mark.parametrize("broken, match", [
    ("pooling", r"1_Pooling/config.json: invalid JSON at line 1 column 1 \(Expecting value\); expected a "
                r"sentence-transformers Pooling config"),
    ("modules", r"modules.json: invalid JSON at line 1 column 1 \(Expecting value\); expected a JSON list"),
    ("missing", r"modules.json: module '1' is a Pooling module, but .*1_Pooling/config.json is missing"),
], ids=["pooling-config", "modules-json", "pooling-config-missing"])
def test_unreadable_sentence_transformers_files_are_named_at_load(tiny_bert, tmp_path, broken, match):
    path = Path(st_checkpoint(tiny_bert, tmp_path / "ckpt", "1_Pooling",
                              pooling_text="not json" if broken == "pooling" else None))
    if broken == "modules":
        (path / "modules.json").write_text("<html>")
    if broken == "missing":
        (path / "1_Pooling" / "config.json").unlink()
    with pytest.raises(ValueError, match=match):
        LLM(str(path), **embed_opts())
