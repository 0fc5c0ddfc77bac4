"""The built-in demo checkpoint: cached, loadable by transformers, and it writes English."""

from __future__ import annotations

import json
import os
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from core_runner.demo import DEMO_MODEL_DIR, DEMO_NAME, demo_checkpoint  # noqa: E402

PROMPTS = ["The weather today is", "In the city of", "He said that", "Once upon a time"]


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
    # the CLI's defaults for the demo come from here: sampled, not greedy
    assert gen["temperature"] == 0.8 and gen["top_p"] == 0.9
    # small enough to keep in git
    assert os.path.getsize(os.path.join(path, "model.safetensors")) <= 20 * 2**20


def test_tokenizer_round_trip(demo_paths):
    tok = transformers.AutoTokenizer.from_pretrained(demo_paths[0])
    assert len(tok) == 2048
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


def test_chat_template(demo_paths):
    tok = transformers.AutoTokenizer.from_pretrained(demo_paths[0])
    messages = [{"role": "user", "content": "Where is he?"}, {"role": "assistant", "content": "In the town."},
                {"role": "user", "content": "And then?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|user|>\nWhere is he?\n<|assistant|>\nIn the town.<|endoftext|>\n"
                    "<|user|>\nAnd then?\n<|assistant|>\n")
    ids = tok.encode(text, add_special_tokens=False)
    # the role markers are single special tokens, not spelled out byte by byte
    assert ids[0] == tok.convert_tokens_to_ids("<|user|>") and ids.count(tok.eos_token_id) == 1


def corpus_words() -> set[str]:
    return set((DEMO_MODEL_DIR / "vocabulary.txt").read_text().split())


def assert_english(text: str, vocabulary: set[str]) -> None:
    """Mostly words of the training text, and no word said five times in a row."""
    words = re.findall(r"[a-z]+", text.lower())
    assert len(words) >= 5, text
    known = sum(w in vocabulary for w in words)
    assert known >= 0.8 * len(words), (text, [w for w in words if w not in vocabulary])
    runs = [words[i:i + 5] for i in range(len(words) - 4)]
    assert not any(len(set(r)) == 1 for r in runs), text


def test_assert_english_rejects_gibberish():
    vocabulary = {"the", "is", "day", "fine"}
    with pytest.raises(AssertionError):
        assert_english("is is is is is the day", vocabulary)
    with pytest.raises(AssertionError):
        assert_english("the xqzt vvrk plonk day fine", vocabulary)
    assert_english("the day is fine, the day is fine", vocabulary)


@pytest.fixture(scope="module")
def demo_llm(demo_paths):
    from core_runner import LLM

    return LLM(demo_paths[0], dtype="float32", device="cpu", max_model_len=256, max_num_seqs=8,
               max_num_batched_tokens=128, block_size=16)


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}],
                         ids=["greedy", "t0.8-p0.9"])
def test_generates_english(demo_llm, sampling):
    from core_runner import SamplingParams

    vocabulary = corpus_words()
    params = SamplingParams(max_tokens=32, **sampling)
    for out in demo_llm.generate(PROMPTS, [params] * len(PROMPTS)):
        assert_english(out.text, vocabulary)


def test_chat_answer_is_english(demo_llm, demo_paths):
    from core_runner import SamplingParams

    tok = transformers.AutoTokenizer.from_pretrained(demo_paths[0])
    prompt = tok.apply_chat_template([{"role": "user", "content": "What did he say to his brother?"}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    (out,) = demo_llm.generate([ids], SamplingParams(max_tokens=48, temperature=0.8, top_p=0.9, seed=1))
    # the answer is one turn: it ends with EOS rather than writing the user's next line
    assert "<|user|>" not in out.text
    assert_english(out.text, corpus_words())
