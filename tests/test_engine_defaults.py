"""Defaults a vLLM user expects: device and dtype "auto", batch limits and KV memory from the
device, the checkpoint's generation_config.json sampling defaults, and the CLI using them."""
from __future__ import annotations

import json
import logging
import shutil
import types

import pytest
import torch

from core_runner import LLM, SamplingParams
from core_runner.config import EngineConfig, choose_batch_limits
from core_runner.engine.defaults import kv_cache_budget, load_generation_defaults, resolve_dtype

GIB = 1 << 30
SMALL = {"dtype": "float32", "device": "cpu", "max_model_len": 64, "max_num_seqs": 4, "block_size": 4,
         "num_kv_blocks": 64}


# ---- device and dtype -----------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_device_auto_resolves_to_cpu_with_a_logged_note(caplog):
    with caplog.at_level(logging.INFO, logger="core_runner.config"):
        cfg = EngineConfig(model="m")
    assert cfg.device == "cpu"
    notes = [r.getMessage() for r in caplog.records if "device='auto'" in r.getMessage()]
    assert notes == ["device='auto': no CUDA device visible, running on the CPU"]
    assert EngineConfig(model="m", device="cpu").device == "cpu"
    with pytest.raises(ValueError, match=r"device='tpu' is invalid: expected 'auto', 'cpu'"):
        EngineConfig(model="m", device="tpu")


@pytest.mark.parametrize("declared, device, want", [
    ("bfloat16", "cpu", torch.float32),       # the CPU path runs in float32 whatever the checkpoint says
    ("bfloat16", "cuda", torch.bfloat16),
    ("float16", "cuda:1", torch.float16),
    ("float32", "cuda", torch.bfloat16),      # as vLLM: float32 checkpoints run in bf16 unless asked
    (None, "cuda", torch.bfloat16),
    (torch.float16, "cuda", torch.float16),   # transformers may hold a torch.dtype
])
def test_dtype_auto_follows_the_checkpoint_on_the_gpu(declared, device, want, caplog):
    hf = types.SimpleNamespace(dtype=declared)
    with caplog.at_level(logging.INFO, logger="core_runner.engine.defaults"):
        assert resolve_dtype("auto", hf, device) is want
    assert any("dtype='auto'" in r.getMessage() for r in caplog.records), "the choice is logged"
    assert resolve_dtype("float32", hf, device) is torch.float32, "an explicit dtype wins"


def test_cpu_engine_with_auto_dtype_is_float32(untied):
    e = LLM(untied.path, dtype="auto", **{k: v for k, v in SMALL.items() if k != "dtype"}).engine
    assert e.dtype is torch.float32
    assert {p.dtype for p in e.model.parameters()} == {torch.float32}


# ---- batch limits -----------------------------------------------------------------------
@pytest.mark.parametrize("device, total, mml, want", [
    ("cuda", 141 * GIB, 2048, (1024, 8192)),   # an H200: the bench's best batch
    ("cuda", 80 * GIB, 32768, (1024, 32768)),  # the budget still holds one full-length prompt
    ("cuda", 24 * GIB, 2048, (256, 2048)),
    ("cuda", None, 2048, (256, 2048)),         # "cuda" named on a machine without one: plans only
    ("cpu", None, 2048, (64, 2048)),
    ("cpu", None, 512, (64, 2048)),
    ("cpu", None, 4096, (64, 4096)),
    ("cpu", None, 16, (64, 1024)),             # never more than 64 full-length requests' tokens
])
def test_batch_limits_are_chosen_from_the_device(device, total, mml, want):
    assert choose_batch_limits(device, total, mml) == want


def test_given_batch_limits_are_kept_and_chosen_ones_logged(caplog):
    assert choose_batch_limits("cuda", 141 * GIB, 2048, max_num_seqs=8) == (8, 8192)
    assert choose_batch_limits("cuda", 141 * GIB, 2048, max_num_batched_tokens=100) == (1024, 100)
    with caplog.at_level(logging.INFO, logger="core_runner.config"):
        cfg = EngineConfig(model="m", device="cpu", max_model_len=4096)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (64, 4096)
    assert any("max_num_seqs=64, max_num_batched_tokens=4096" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match=r"max_num_seqs=0 is invalid: expected an integer >= 1 or None"):
        EngineConfig(model="m", device="cpu", max_num_seqs=0)


# ---- KV memory ----------------------------------------------------------------------------
def test_memory_fields_per_device():
    cuda = EngineConfig(model="m", device="cuda")
    assert cuda.gpu_memory_utilization == 0.9 and cuda.kv_cache_memory_fraction is None
    cpu = EngineConfig(model="m", device="cpu")
    assert cpu.gpu_memory_utilization is None and cpu.kv_cache_memory_fraction == 0.5
    with pytest.raises(ValueError, match=r"kv_cache_memory_fraction=0.8 is invalid: .*on CUDA use "
                                         r"gpu_memory_utilization"):
        EngineConfig(model="m", device="cuda", kv_cache_memory_fraction=0.8)
    with pytest.raises(ValueError, match=r"not both"):
        EngineConfig(model="m", device="cpu", kv_cache_memory_fraction=0.5, gpu_memory_utilization=0.5)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0 is invalid: .*\(0, 1\]"):
        EngineConfig(model="m", device="cuda", gpu_memory_utilization=0)


def test_kv_budget_is_utilization_of_total_less_memory_in_use():
    cfg = EngineConfig(model="m", device="cuda", gpu_memory_utilization=0.5)
    # 100 GiB device, 10 GiB in use (weights), 5 GiB activation peak: 50 - 10 - 5 = 35 GiB
    assert kv_cache_budget(cfg, free=90 * GIB, total=100 * GIB, activation_bytes=5 * GIB) == 35 * GIB
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 leaves no memory for the KV cache.*"
                                         r"60.00 GiB is in use"):
        kv_cache_budget(cfg, free=40 * GIB, total=100 * GIB)
    cpu = EngineConfig(model="m", device="cpu", kv_cache_memory_fraction=0.25)
    assert kv_cache_budget(cpu, free=8 * GIB, total=64 * GIB) == 2 * GIB


def test_gpu_memory_utilization_sizes_the_pool_through_the_probe(untied):
    opts = {k: v for k, v in SMALL.items() if k != "num_kv_blocks"}
    rep = LLM(untied.path, **SMALL).engine.memory_report()
    block_bytes = rep["kv_bytes_per_token"] * 4
    row_bytes = rep["state_bytes_per_row"] * (4 + 1)
    total = 10 * (30 * block_bytes + row_bytes)  # 0.1 of it: 30 blocks on an idle device
    seen = []

    def probe(free: int):
        def read(device: torch.device) -> tuple[int, int]:
            seen.append(device)
            return free, total
        return read

    idle = LLM(untied.path, memory_probe=probe(total), gpu_memory_utilization=0.1, **opts).engine
    busy = LLM(untied.path, memory_probe=probe(total - 10 * block_bytes), gpu_memory_utilization=0.1, **opts).engine
    more = LLM(untied.path, memory_probe=probe(total), gpu_memory_utilization=0.15, **opts).engine
    assert (idle.num_blocks, busy.num_blocks) == (30, 20), "memory in use comes off the budget"
    assert more.num_blocks > idle.num_blocks
    assert seen == [torch.device("cpu")] * 3
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.1 leaves no memory"):
        LLM(untied.path, memory_probe=probe(total // 20), gpu_memory_utilization=0.1, **opts)


# ---- generation_config.json ---------------------------------------------------------------
def _with_generation_config(src: str, dst, content) -> str:
    shutil.copytree(src, dst)
    text = content if isinstance(content, str) else json.dumps(content)
    (dst / "generation_config.json").write_text(text)
    return str(dst)


GEN = {"eos_token_id": [250, 251], "temperature": 0.5, "top_k": 0, "top_p": 0.8, "min_p": 0.05,
       "repetition_penalty": 1.1, "max_new_tokens": 3, "do_sample": True}


def test_checkpoint_sampling_defaults_apply_unless_given(untied, tmp_path):
    path = _with_generation_config(untied.path, tmp_path / "ckpt", GEN)
    llm = LLM(path, **SMALL)
    d = llm.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.repetition_penalty, d.max_tokens) == \
        (0.5, -1, 0.8, 0.05, 1.1, 3)  # top_k 0 (transformers: off) is -1 here
    assert d is not llm.get_default_sampling_params(), "a fresh object each time: editing it is safe"
    assert llm.engine.eos_token_ids == (250, 251)
    prompts = [[1, 2, 3], [4, 5]]
    for out in llm.generate(prompts):  # no SamplingParams: the checkpoint's max_new_tokens
        assert _three_or_eos(out.token_ids)
    given = llm.generate(prompts, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert [len(o.token_ids) for o in given] == [5, 5], "a SamplingParams built by hand is used as given"
    d.max_tokens = 4  # vLLM's way to change one default and keep the others
    d.ignore_eos = True
    assert [len(o.token_ids) for o in llm.generate(prompts, d)] == [4, 4]
    rid = llm.engine.add_request([7, 8])  # the engine API takes the same defaults
    outs = {}
    while llm.engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in llm.engine.step()})
    assert _three_or_eos(outs[rid].token_ids)


def _three_or_eos(ids: list[int]) -> bool:
    return len(ids) == 3 or (len(ids) < 3 and ids[-1] in (250, 251))


def test_generation_config_vllm_ignores_the_sampling_defaults(untied, tmp_path):
    path = _with_generation_config(untied.path, tmp_path / "ckpt", GEN)
    llm = LLM(path, generation_config="vllm", **SMALL)
    plain = SamplingParams()
    got = llm.get_default_sampling_params()
    assert (got.temperature, got.top_k, got.top_p, got.max_tokens) == \
        (plain.temperature, plain.top_k, plain.top_p, plain.max_tokens)
    assert llm.engine.eos_token_ids == (250, 251), "EOS still comes from the file"


@pytest.mark.parametrize("content, match", [
    ("{not json", r"invalid JSON at line 1"),
    ({"temperature": -1.0}, r"sampling defaults are invalid: SamplingParams.temperature=-1.0"),
    ({"top_p": 0.0}, r"sampling defaults are invalid: SamplingParams.top_p=0.0"),
])
def test_bad_generation_config_names_the_file(untied, tmp_path, content, match):
    path = _with_generation_config(untied.path, tmp_path / "ckpt", content)
    with pytest.raises(ValueError, match=match) as info:
        LLM(path, **SMALL)
    assert str(tmp_path / "ckpt" / "generation_config.json") in str(info.value)
    with pytest.raises(ValueError, match="generation_config='hf' is invalid"):
        EngineConfig(model=path, generation_config="hf")


def test_eos_falls_back_to_config_json():
    cfg = types.SimpleNamespace(eos_token_id=9)
    assert load_generation_defaults("/nonexistent", cfg).eos_token_ids == (9,)
    assert load_generation_defaults("/nonexistent", types.SimpleNamespace()).eos_token_ids == ()


# ---- CLI ------------------------------------------------------------------------------------
def test_cli_version_and_help_show_defaults(capsys):
    from core_runner import __version__
    from core_runner.cli import main

    with pytest.raises(SystemExit) as ex:
        main(["--version"])
    assert ex.value.code == 0 and capsys.readouterr().out.strip() == f"core-runner {__version__}"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    shown = {"--device": "auto", "--max-model-len": "min(2048", "--gpu-memory-utilization": "0.9",
             "--generation-config": "auto", "--max-num-seqs": "from the device: 1024 on a >= 70 GiB GPU",
             "--temperature": "the checkpoint's generation_config.json"}
    for flag, default in shown.items():
        assert flag in text and f"(default: {default}" in text.split(flag, 2)[-1], flag
    with pytest.raises(SystemExit):
        main(["conformance", "--help"])
    assert "(default: 12)" in " ".join(capsys.readouterr().out.split()), "plain defaults shown by argparse"


def _word_tokenizer(path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 3, "hello": 4, "world": 5}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"}')


def test_cli_runs_a_512_position_checkpoint_without_flags(untied, tmp_path, capsys):
    from core_runner.cli import main

    path = tmp_path / "ckpt"
    shutil.copytree(untied.path, path)
    assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == 512
    _word_tokenizer(path)
    assert main(["generate", "--model", str(path), "--max-tokens", "3", "--json", "hello world"]) == 0
    out = json.loads(capsys.readouterr().out.strip())
    assert len(out["token_ids"]) <= 3 and out["finish_reason"] in ("length", "stop")


# ---- layers ---------------------------------------------------------------------------------
def test_layers_export_every_public_layer_with_a_docstring():
    import ast
    from pathlib import Path

    import core_runner.layers as layers

    public = set()
    for f in Path(layers.__file__).parent.glob("*.py"):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_"):
                public.add(node.name)
    missing = sorted(public - set(layers.__all__))
    assert not missing, f"not exported from core_runner.layers: {missing}"
    # __doc__, not inspect.getdoc: a class without one would inherit nn.Module's
    undocumented = [n for n in layers.__all__ if not (getattr(layers, n).__doc__ or "").strip()]
    assert not undocumented, f"no docstring: {undocumented}"
