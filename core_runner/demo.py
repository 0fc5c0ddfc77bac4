"""A tiny built-in demo checkpoint, so ``core-runner generate`` works offline.

``demo_checkpoint()`` returns the path of a Hugging Face style checkpoint
directory for the ``Qwen3ForCausalLM`` architecture: ``config.json``,
``model.safetensors`` (transformers' parameter names), ``generation_config.json``
and a real byte-level BPE tokenizer (``tokenizer.json`` +
``tokenizer_config.json``) trained on the small English text in
``demo_corpus.txt`` next to this file.

The model is a 2-layer, 64-wide Qwen3 with *random* weights (seed 0), so the text
it generates is gibberish. It exists only to exercise the whole pipeline --
tokenizer, model plugin, engine, sampler -- on a machine with no internet and no
model hub. Everything is made deterministically on first use (same bytes every
time) and cached; later calls reuse the cached directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

DEMO_NAME = "demo-qwen3-v1"
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024
CORPUS = Path(__file__).with_name("demo_corpus.txt")
REQUIRED_FILES = ("config.json", "model.safetensors", "generation_config.json",
                  "tokenizer.json", "tokenizer_config.json")


def default_cache_root() -> Path:
    """``$CORE_RUNNER_CACHE`` if set, else ``~/.cache/core-runner``."""
    env = os.environ.get("CORE_RUNNER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "core-runner"


def demo_checkpoint(cache_dir: str | None = None) -> str:
    """Return the path of the demo checkpoint, building it on first use.

    The checkpoint lives in ``<cache_dir>/demo-qwen3-v1``, where ``cache_dir``
    defaults to ``default_cache_root()``. It is built in a temporary sibling
    directory and renamed into place, so concurrent callers never see a
    half-written checkpoint; a caller that loses the race discards its copy.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / DEMO_NAME
    if all((final / f).is_file() for f in REQUIRED_FILES):
        return str(final)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}.tmp-", dir=root))
    try:
        _build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process won the race (or a stale, incomplete dir is there).
            if not all((final / f).is_file() for f in REQUIRED_FILES):
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final)


def _train_tokenizer():
    """Train a byte-level BPE tokenizer on the demo corpus (single-threaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: same merges every time
    try:
        tok.train_from_iterator(lines, trainer=trainer)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    return tok


def _build(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = _train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS_TOKEN)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")

    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(str(out), safe_serialization=True)
