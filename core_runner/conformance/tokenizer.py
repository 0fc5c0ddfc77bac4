"""A tokenizer for the suite's checkpoints: byte-level BPE over a synthetic vocabulary of
exactly the config's ``vocab_size``, saved as transformers' ``PreTrainedTokenizerFast`` so
that the engine (``AutoTokenizer``) and the reference load the same files.

Why byte-level: grammars (xgrammar) need a vocabulary whose tokens are known strings, and
every string must be writable; the 256 byte symbols (GPT-2's byte-to-unicode table) make
any text encodable, and merges of common characters give multi-character tokens as real
vocabularies have. Layout: the special tokens first (ids 0..3), the 256 byte symbols, then
merged tokens (a token plus one character, breadth first) up to ``vocab_size``. A vocabulary
too small for the byte symbols (the tiny examples' 256) gets the 95 printable ASCII
characters and a newline instead (a raw vocabulary: other characters become the unknown
token); under 100 tokens no tokenizer is written.

Which specials: a config with ``type_vocab_size`` has token-type embeddings, an encoder's
sign: ``[PAD] [UNK] [CLS] [SEP]`` with the pair template ``[CLS] a [SEP] b [SEP]`` (types 0
then 1 when ``type_vocab_size >= 2``, all 0 otherwise). Any other config is a decoder's:
``<|endoftext|>`` (eos and pad), ``<|im_start|>``, ``<|im_end|>``, ``<|unk|>``, pairs
concatenated, and a minimal chat template. The config's own token ids are left as the
reference writes them (None): the tokenizer names its specials but the suite's requests
never stop on them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENCODER_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
DECODER_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>")
# the characters merges are built from, most useful first (JSON punctuation, digits, letters)
_MERGE_CHARS = ' e"tao:,{}ins0123456789rhldcu[]-_.\n'
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: every byte as a printable unicode character (the ByteLevel alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n"


def min_vocab_size() -> int:
    """Below this there is no room for the specials and the printable characters."""
    return len(ENCODER_SPECIALS) + len(_PRINTABLE)


def byte_level(vocab_size: int) -> bool:
    """Byte symbols where they fit (any text encodes); printable ASCII characters otherwise."""
    return vocab_size >= len(ENCODER_SPECIALS) + 256


def is_encoder(config: Any) -> bool:
    return getattr(config, "type_vocab_size", None) is not None


def _vocab_and_merges(vocab_size: int, specials: tuple[str, ...]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab = {s: i for i, s in enumerate(specials)}
    if byte_level(vocab_size):
        table = bytes_to_unicode()
        symbols = [table[b] for b in range(256)]
        chars = [table[b] for b in _MERGE_CHARS.encode()]
    else:
        symbols, chars = list(_PRINTABLE), list(_MERGE_CHARS)
    for sym in symbols:
        vocab[sym] = len(vocab)
    merges: list[tuple[str, str]] = []
    level = list(chars)
    while len(vocab) < vocab_size:
        nxt = []
        for left in level:
            for c in chars:
                tok = left + c
                if len(vocab) >= vocab_size:
                    break
                if tok in vocab:
                    continue
                vocab[tok] = len(vocab)
                merges.append((left, c))
                nxt.append(tok)
        level = nxt
    return vocab, merges


def write_tokenizer(path: str | Path, config: Any) -> bool:
    """Write tokenizer.json + tokenizer_config.json into ``path`` for ``config`` (an HF
    config); False (nothing written) when its vocab_size leaves no room for the byte symbols."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab_size = int(config.vocab_size)
    if vocab_size < min_vocab_size():
        return False
    encoder = is_encoder(config)
    specials = ENCODER_SPECIALS if encoder else DECODER_SPECIALS
    vocab, merges = _vocab_and_merges(vocab_size, specials)
    unk = specials[1] if encoder else specials[3]
    if byte_level(vocab_size):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        # one "word" per text: merges may cross spaces (as JSON tokens do), and the text is short
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    else:  # characters as they are (xgrammar reads a raw vocabulary); others become the unknown token
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk))
        tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(specials))
    if encoder:
        second = 1 if int(config.type_vocab_size) >= 2 else 0
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair=f"[CLS] $A [SEP] $B:{second} [SEP]:{second}",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
        names = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    else:
        names = dict(eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|unk|>")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=1 << 20, **names)
    if not encoder:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    _check_size(Path(path), vocab_size)
    return True


def _check_size(path: Path, vocab_size: int) -> None:
    data = json.loads((path / "tokenizer.json").read_text())
    n = len(data["model"]["vocab"])
    if n != vocab_size:
        raise AssertionError(f"the suite's tokenizer has {n} tokens for vocab_size {vocab_size}")
