"""The built-in demo checkpoint: deterministic, loadable by transformers, offline."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from core_runner.demo import DEMO_NAME, demo_checkpoint  # noqa: E402


def _read(path: str, name: str) -> bytes:
    with open(os.path.join(path, name), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def demo_paths(tmp_path_factory):
    a = demo_checkpoint(str(tmp_path_factory.mktemp("cache_a")))
    b = demo_checkpoint(str(tmp_path_factory.mktemp("cache_b")))
    return a, b


def test_deterministic_and_cached(demo_paths):
    a, b = demo_paths
    assert os.path.basename(a) == DEMO_NAME and a != b
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert _read(a, name) == _read(b, name), name
    # Second call reuses the cache and leaves no temp dirs behind.
    root = os.path.dirname(a)
    assert demo_checkpoint(root) == a
    assert os.listdir(root) == [DEMO_NAME]


def test_config_files(demo_paths):
    path = demo_paths[0]
    cfg = json.loads(_read(path, "config.json"))
    assert cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["model_type"] == "qwen3"
    gen = json.loads(_read(path, "generation_config.json"))
    assert gen["eos_token_id"] == cfg["eos_token_id"]


def test_tokenizer_round_trip(demo_paths):
    tok = transformers.AutoTokenizer.from_pretrained(demo_paths[0])
    assert 1000 <= len(tok) <= 2000
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id is not None
    assert tok.pad_token_id == tok.eos_token_id
    for text in ["The weather in the city is mild today.", "Zébra 42 ü ✓ 東京 \n\ttabs"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    cfg = json.loads(_read(demo_paths[0], "config.json"))
    assert tok.eos_token_id == cfg["eos_token_id"] and len(tok) == cfg["vocab_size"]


def test_transformers_loads_model(demo_paths):
    tok = transformers.AutoTokenizer.from_pretrained(demo_paths[0])
    model = transformers.Qwen3ForCausalLM.from_pretrained(demo_paths[0]).eval()
    ids = torch.tensor([tok.encode("Good morning, how are you?")])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
