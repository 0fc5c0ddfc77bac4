"""Stop strings on incrementally detokenised text, and EOS handling.

The checkpoint is a tiny random Qwen3 with a byte-level tokenizer built on the spot (no
training): one token per printable ASCII byte plus an EOS token, so whatever the random
model generates decodes to text that stop strings can be cut from.
"""
from __future__ import annotations

import json

import pytest
import torch

from core_runner import LLM, SamplingParams
from core_runner.engine.detokenizer import IncrementalDetokenizer

PROMPTS = ["The weather in the city is", "Good morning, how are"]
EOS = "<|eos|>"


def byte_chars() -> dict[int, str]:
    """The byte-level pre-tokenizer's byte -> character table: printable Latin-1 bytes
    stand for themselves, the others take the characters from U+0100 on, in order."""
    own = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in own]
    return {**{b: chr(b) for b in own}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def byte_tokenizer(byte_values):
    """A byte-level BPE tokenizer without merges: one token per byte in ``byte_values``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = byte_chars()
    assert set(chars.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={chars[b]: i for i, b in enumerate(byte_values)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return tok


@pytest.fixture(scope="module")
def demo(tmp_path_factory, single_torch_thread):
    import transformers

    path = tmp_path_factory.mktemp("byte_ckpt")
    tok = byte_tokenizer(range(0x20, 0x7F))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "clean_up_tokenization_spaces": False}))
    eos = tok.token_to_id(EOS)
    cfg = transformers.Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        initializer_range=0.15, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return LLM(str(path), dtype="float32", max_model_len=128, max_num_seqs=4, block_size=8, num_kv_blocks=64)


def _greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def test_incremental_text_equals_full_decode():
    """Multi-byte characters span several byte tokens: text is held back until complete."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer(range(256)), eos_token=EOS)
    text = "Zébra 42 ü ✓ 東京 mild weather \n\ttabs"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    d = IncrementalDetokenizer(tok, [])
    seen = []
    for t in ids:
        assert d.append(t) is None
        seen.append(d.text)
        assert "\ufffd" not in d.text
    assert d.text == text and seen[1] == "Z" and seen[2] == "Zé"  # "é" is two bytes
    d = IncrementalDetokenizer(tok, ["東京"])
    hits = []
    for t in ids:
        hits.append(d.append(t))
        if hits[-1] is not None:
            break  # the engine finishes the request here
    assert hits[-1] == "東京" and d.text == text[: text.index("東京")]
    assert len(hits) == len(text[: text.index("京") + 1].encode("utf-8"))  # found on the token completing it


def test_stop_string_cuts_text_and_reports_it(demo):
    base = demo.generate(PROMPTS, _greedy(40))
    for out in base:
        text = out.text
        assert len(text) > 20, text
        stop = text[12:15]
        cut = text.find(stop)
        got = demo.generate([out.prompt_token_ids], _greedy(40, stop=["never-appears", stop]))[0]
        assert got.finish_reason == "stop" and got.stop_reason == stop
        assert got.text == text[:cut]
        assert got.token_ids == out.token_ids[: len(got.token_ids)] and len(got.token_ids) < len(out.token_ids)
        # the token that completed the stop string is the last one generated
        assert stop in demo.tokenizer.decode(got.token_ids) and stop not in demo.tokenizer.decode(got.token_ids[:-1])


def test_stop_string_waits_for_min_tokens(demo):
    out = demo.generate(PROMPTS[:1], _greedy(40))[0]
    first_tok_text = demo.tokenizer.decode(out.token_ids[:1])
    assert first_tok_text.strip(), "the first token should carry text"
    stop = first_tok_text[-1]
    early = demo.generate(PROMPTS[:1], _greedy(40, stop=[stop]))[0]
    assert early.finish_reason == "stop" and len(early.token_ids) == 1 and early.stop_reason == stop
    # stop strings are checked from the min_tokens-th token on (as vLLM does)
    late = demo.generate(PROMPTS[:1], _greedy(40, stop=[stop], min_tokens=5))[0]
    assert late.token_ids == out.token_ids[: len(late.token_ids)]
    assert len(late.token_ids) >= 5
    if late.finish_reason == "stop":
        new_text = demo.tokenizer.decode(late.token_ids[-1:])
        assert late.stop_reason == stop and stop in new_text


def test_eos_ends_unless_ignored(demo):
    eos = demo.tokenizer.eos_token_id
    sp = SamplingParams(max_tokens=6, temperature=0.0, logit_bias={eos: 100.0})
    out = demo.generate(PROMPTS[:1], sp)[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason is None
    held = demo.generate(PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0.0, logit_bias={eos: 100.0},
                                                      min_tokens=3))[0]
    assert eos not in held.token_ids[:3] and held.token_ids[3] == eos and held.finish_reason == "stop"
    ignored = demo.generate(PROMPTS[:1], SamplingParams(max_tokens=6, temperature=0.0, logit_bias={eos: 100.0},
                                                         ignore_eos=True))[0]
    assert ignored.token_ids == [eos] * 6 and ignored.finish_reason == "length"
