"""Where a model lives: a local checkpoint directory, or a Hugging Face model id resolved
through the hub cache (``huggingface_hub.snapshot_download``).

A name that is an existing directory is used as it is (a ``revision`` is then an error:
a directory has one version). Anything else that looks like a path (absolute, ``./``,
``~``) is a missing directory. The rest is a model id: ``HF_HUB_OFFLINE=1`` (read at call
time, like ``HF_HUB_CACHE`` / ``HF_HOME``) restricts it to the local cache. Only what
the engine reads is downloaded: JSON, safetensors and tokenizer files, never pickles.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_TOKENIZER_FILES = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_TRUE = ("1", "on", "yes", "true")


def hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> str:
    """The hub cache as the environment names it now (huggingface_hub reads it once, at
    import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _looks_like_path(name: str) -> bool:
    # a hub id is "name" or "org/name"; more separators or a path prefix mean a path
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def resolve_model(name: str, revision: str | None = None, *, what: str = "model") -> Path:
    """The local directory holding ``name`` (``what`` is "model" or "tokenizer": the
    option named in errors, and which files a download fetches)."""
    local = Path(os.path.expanduser(name))
    if local.is_dir():
        if revision is not None:
            option = "revision" if what == "model" else "tokenizer_revision"
            raise ValueError(
                f"{option}={revision!r} is invalid for {what}={name!r}: that is a local directory, which has one "
                "version; a revision applies to a Hugging Face model id (leave it None)"
            )
        return local
    if _looks_like_path(name) or local.exists():
        state = "not a directory" if local.exists() else "no such directory"
        found = ", so no config.json there" if what == "model" else ""
        raise FileNotFoundError(
            f"{what}={name!r}: {state}{found} (expected a Hugging Face checkpoint directory or a model id such as "
            "'Qwen/Qwen3-0.6B')"
        )
    return _from_hub(name, revision, what)


def _from_hub(repo_id: str, revision: str | None, what: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    cache = hub_cache_dir()
    rev = revision or "main"
    where = f"{what}={repo_id!r} (revision {rev!r})"
    try:
        path = snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
            allow_patterns=_MODEL_FILES if what == "model" else _TOKENIZER_FILES,
        )
    except HFValidationError as e:
        raise FileNotFoundError(
            f"{what}={repo_id!r} is neither a local directory nor a valid Hugging Face model id ({e})"
        ) from e
    except LocalEntryNotFoundError as e:
        how = (f"download it where the network is reachable (`hf download {repo_id}"
               f"{f' --revision {revision}' if revision else ''}`, with HF_HUB_CACHE={cache}) "
               "or pass a local checkpoint directory")
        if offline:
            raise FileNotFoundError(
                f"{where} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE=1 forbids downloading it; "
                f"{how}; no local directory of that name exists either"
            ) from e
        raise FileNotFoundError(f"{where} could not be fetched from the hub nor found in the cache {cache} ({e}); "
                                f"{how}") from e
    except RevisionNotFoundError as e:
        raise FileNotFoundError(f"{where}: the repository has no such revision (a branch, tag or commit)") from e
    except GatedRepoError as e:
        raise PermissionError(f"{where} is gated: accept its terms on the hub and log in (`hf auth login`)") from e
    except RepositoryNotFoundError as e:
        raise FileNotFoundError(
            f"{what}={repo_id!r} is neither a local directory nor a Hugging Face repository (or it is private: "
            "log in with `hf auth login`)"
        ) from e
    return Path(path)


def resolve_tokenizer(config: Any, model_path: Path) -> Path:
    """The tokenizer's directory for an EngineConfig: ``tokenizer`` or the model, at
    ``tokenizer_revision`` (default: ``revision`` when it is the model's own)."""
    own = config.tokenizer is None
    revision = config.tokenizer_revision
    if revision is None and own:
        revision = config.revision
    if own and revision == config.revision:
        return model_path
    return resolve_model(config.tokenizer or config.model, revision, what="tokenizer")
