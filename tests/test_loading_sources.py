"""Where a model comes from and its JSON files: model ids through a fake Hugging Face hub
cache (HF_HUB_OFFLINE=1), revisions, config.json checks (no checkpoint code, well-formed
architectures) and corrupt JSON files named in errors."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch
from checkpoint_surgery import copy_checkpoint, edit_json, fake_hub_repo

from core_runner import LLM
from core_runner.engine.defaults import load_generation_defaults
from core_runner.loader import CheckpointError, load_hf_config, load_tokenizer, resolve_model

SHA_A = "a" * 40
SHA_B = "b" * 40
OPTS = dict(dtype="float32", max_model_len=32, max_num_seqs=2, block_size=4, num_kv_blocks=16)


def tiny_tokenizer(dir_: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 7, "world": 9}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(dir_ / "tokenizer.json"))
    (dir_ / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"}')


@pytest.fixture
def hub(checkpoints, tmp_path, monkeypatch):
    """A hub cache with org/tiny: main -> the untied checkpoint, tag v2 -> the tied one
    with a tokenizer. Offline, so nothing is fetched."""
    cache = tmp_path / "hub"
    tied = copy_checkpoint(checkpoints["tied"].path, tmp_path / "tied")
    tiny_tokenizer(tied)
    fake_hub_repo(cache, "org/tiny", {"main": (SHA_A, Path(checkpoints["untied"].path)), "v2": (SHA_B, tied)})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # "org/tiny" must not be a local directory by accident
    return cache


def _kv_heads(llm) -> int:
    return int(llm.engine.hf_config.num_key_value_heads)


def test_model_id_loads_from_the_cache(hub, checkpoints):
    llm = LLM("org/tiny", **OPTS)
    assert llm.engine.model_path == hub / "models--org--tiny" / "snapshots" / SHA_A
    assert _kv_heads(llm) == 2 and llm.engine.tokenizer is None
    want = checkpoints["untied"].hf.model.norm.weight
    assert torch.equal(llm.engine.model.model.norm.weight, want)


def test_hf_home_locates_the_cache(untied, tmp_path, monkeypatch):
    fake_hub_repo(tmp_path / "home" / "hub", "org/tiny", {"main": (SHA_A, Path(untied.path))})
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/tiny") == tmp_path / "home" / "hub" / "models--org--tiny" / "snapshots" / SHA_A
    assert resolve_model("org/tiny", SHA_A).name == SHA_A


@pytest.mark.parametrize("revision", ["v2", SHA_B])
def test_model_id_at_a_revision(hub, revision):
    llm = LLM("org/tiny", revision=revision, **OPTS)
    assert llm.engine.model_path.name == SHA_B and _kv_heads(llm) == 4
    assert llm.engine.tokenizer is not None  # the tokenizer follows the model's revision
    assert llm.engine.tokenizer.encode("hello world") == [7, 9]


def test_tokenizer_revision(hub):
    llm = LLM("org/tiny", tokenizer_revision="v2", **OPTS)
    assert _kv_heads(llm) == 2 and llm.engine.tokenizer.encode("world") == [9]


def test_unknown_id_offline_says_how_to_get_it(hub):
    with pytest.raises(FileNotFoundError) as e:
        LLM("org/absent", **OPTS)
    msg = str(e.value)
    assert "model='org/absent' (revision 'main') is not in the Hugging Face cache" in msg, msg
    assert str(hub) in msg and "HF_HUB_OFFLINE=1" in msg and "hf download org/absent" in msg


def test_unknown_revision_offline(hub):
    with pytest.raises(FileNotFoundError, match=r"model='org/tiny' \(revision 'v9'\) is not in the Hugging Face "
                                                r"cache.*hf download org/tiny --revision v9"):
        LLM("org/tiny", revision="v9", **OPTS)


def test_revision_of_a_local_directory_is_rejected(untied):
    with pytest.raises(ValueError, match=r"revision='v2' is invalid for model=.*: that is a local directory"):
        LLM(untied.path, revision="v2", **OPTS)
    with pytest.raises(ValueError, match=r"revision='' is invalid"):
        LLM(untied.path, revision="", **OPTS)


def test_missing_path_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"no such directory, so no config.json there"):
        resolve_model(str(tmp_path / "nope" / "ckpt"))
    assert resolve_model(str(tmp_path)) == tmp_path
    (tmp_path / "file").write_text("")
    with pytest.raises(FileNotFoundError, match=r"tokenizer='.*file': not a directory \(expected"):
        resolve_model(str(tmp_path / "file"), what="tokenizer")


# ---- config.json ------------------------------------------------------------------
@pytest.fixture
def ckpt(untied, tmp_path):
    return copy_checkpoint(untied.path, tmp_path / "ckpt")


def test_auto_map_is_refused_without_reading_stdin(ckpt, monkeypatch):
    def edit(cfg):
        cfg["architectures"] = ["CustomForCausalLM"]
        cfg["model_type"] = "custom_remote"
        cfg["auto_map"] = {"AutoConfig": "configuration_custom.CustomConfig",
                           "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}

    edit_json(ckpt, "config.json", edit)
    (ckpt / "modeling_custom.py").write_text("raise SystemExit('checkpoint code ran')\n")
    (ckpt / "configuration_custom.py").write_text("raise SystemExit('checkpoint code ran')\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # a prompt would read EOF here, not hang
    with pytest.raises(CheckpointError) as e:
        LLM(str(ckpt), **OPTS)
    msg = str(e.value)
    assert f"{ckpt / 'config.json'}: 'auto_map' (['AutoConfig', 'AutoModelForCausalLM'])" in msg, msg
    assert "never runs" in msg and "'CustomForCausalLM'" in msg and "register a plugin" in msg


def test_auto_map_is_ignored_when_a_plugin_serves_the_architecture(ckpt):
    edit_json(ckpt, "config.json", lambda c: c.__setitem__("auto_map", {"AutoConfig": "configuration_q.QConfig"}))
    (ckpt / "configuration_q.py").write_text("raise SystemExit('checkpoint code ran')\n")
    llm = LLM(str(ckpt), **OPTS)
    assert llm.engine.architecture == "Qwen3ForCausalLM"
    with pytest.raises(CheckpointError, match="auto_map"):
        load_hf_config(ckpt)  # without a registry nothing serves it


@pytest.mark.parametrize("value, says", [
    ("Qwen3ForCausalLM", "'architectures' is the string 'Qwen3ForCausalLM'; expected a list"),
    (None, "'architectures' is empty \\(None\\), so no plugin can be chosen"),
    ([], "'architectures' is empty \\(\\[\\]\\), so no plugin can be chosen"),
    ("<missing>", "'architectures' is missing, so no plugin can be chosen"),
    ([3], "'architectures' is \\[3\\]; expected a list of model class names"),
])
def test_bad_architectures(ckpt, value, says):
    edit_json(ckpt, "config.json",
              lambda c: c.pop("architectures") if value == "<missing>" else c.__setitem__("architectures", value))
    with pytest.raises(CheckpointError, match=rf"config\.json: {says}"):
        LLM(str(ckpt), **OPTS)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json"])
def test_invalid_json_names_the_file(ckpt, name):
    tiny_tokenizer(ckpt)
    if not (ckpt / name).exists():
        (ckpt / name).write_text("{}")
    text = (ckpt / name).read_text()
    (ckpt / name).write_text(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match=rf"{ckpt / name}: invalid JSON at line \d+ column \d+"):
        LLM(str(ckpt), **OPTS)


def test_bad_eos_in_generation_config(ckpt):
    (ckpt / "generation_config.json").write_text('{"eos_token_id": "</s>"}')
    with pytest.raises(CheckpointError, match=r"generation_config\.json: eos_token_id is '</s>'; expected a token"):
        load_generation_defaults(ckpt, load_hf_config(ckpt))
    (ckpt / "generation_config.json").write_text('{"eos_token_id": [5, 6]}')
    assert load_generation_defaults(ckpt, load_hf_config(ckpt)).eos_token_ids == (5, 6)


def test_tokenizer_that_does_not_load_names_the_directory(ckpt):
    (ckpt / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}')
    with pytest.raises(CheckpointError, match=rf"{ckpt}: the tokenizer \(tokenizer\.json\) could not be loaded"):
        load_tokenizer(ckpt)


def test_cli_takes_a_model_id_at_a_revision(hub, capsys):
    """`core-runner generate --model org/tiny --revision v2` resolves through the hub cache."""
    from core_runner.cli import main

    args = ["generate", "--model", "org/tiny", "--revision", "v2", "--device", "cpu", "--dtype", "float32",
            "--max-model-len", "32", "--num-kv-blocks", "16", "--max-tokens", "2", "--json", "hello world"]
    assert main(args) == 0
    assert len(json.loads(capsys.readouterr().out.strip())["token_ids"]) <= 2
    assert main(args[:4] + ["no-such-rev"] + args[5:]) != 0
    assert "revision 'no-such-rev') is not in the Hugging Face cache" in capsys.readouterr().err
