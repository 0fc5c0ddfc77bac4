"""Which safetensors files hold a checkpoint's tensors, and reading them with errors that
name the file.

With ``model.safetensors.index.json`` its ``weight_map`` decides: every shard it names
must exist and only the tensors it assigns to a shard are read from it. Without an index,
every ``*.safetensors`` file is read. Pickle checkpoints (``.bin`` / ``.pt``) are refused,
never unpickled: unpickling runs code from the file.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from core_runner.loader.files import CheckpointError, read_json

INDEX = "model.safetensors.index.json"
_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt")


def conversion_hint(path: Path) -> str:
    out = f"{path}-safetensors"
    return (
        "convert it once, on a machine where you trust the files (loading a pickle runs code from it), with "
        "transformers, whose save_pretrained writes safetensors (safe_serialization=True, the default):\n"
        "    python -c \"from transformers import AutoModelForCausalLM, AutoTokenizer; "
        f"AutoModelForCausalLM.from_pretrained('{path}').save_pretrained('{out}'); "
        f"AutoTokenizer.from_pretrained('{path}').save_pretrained('{out}')\"\n"
        f"then load {out}"
    )


def checkpoint_files(path: str | Path) -> dict[Path, list[str] | None]:
    """Each safetensors file to read, with the tensor names to read from it (None: all)."""
    path = Path(path)
    index = path / INDEX
    if index.is_file():
        return _indexed_files(path, index)
    files = sorted(path.glob("*.safetensors"))
    if files:
        return {f: None for f in files}
    pickles = sorted({p.name for pattern in _PICKLES for p in path.glob(pattern)})
    if pickles:
        raise CheckpointError(
            f"{path} holds only PyTorch pickle weights ({', '.join(pickles[:4])}{' ...' if len(pickles) > 4 else ''}); "
            f"core-runner reads *.safetensors only and never unpickles; {conversion_hint(path)}"
        )
    raise FileNotFoundError(
        f"no *.safetensors files in {str(path)!r} (nor {INDEX}): core-runner reads safetensors weights only (a model "
        "id downloads only those; a repository that has only pytorch_model.bin must be converted: "
        f"{conversion_hint(path)})"
    )


def _indexed_files(path: Path, index: Path) -> dict[Path, list[str] | None]:
    weight_map = read_json(index, "a safetensors index with a 'weight_map' object").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: 'weight_map' is {type(weight_map).__name__ if weight_map else weight_map!r}; "
                              "expected a non-empty object mapping tensor names to shard file names")
    by_file: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or Path(shard).name != shard:
            raise CheckpointError(f"{index}: tensor {name!r} maps to {shard!r}; expected the name of a "
                                  "*.safetensors file in the same directory")
        by_file.setdefault(shard, []).append(name)
    missing = sorted(f for f in by_file if not (path / f).is_file())
    if missing:
        raise FileNotFoundError(
            f"{index} names shard(s) {missing} that are not in {path} ({len(by_file)} shards listed; an incomplete "
            "download? fetch the missing files again)"
        )
    return {path / f: names for f, names in sorted(by_file.items())}


@contextmanager
def open_safetensors(file: Path) -> Iterator[Any]:
    """``safe_open`` whose header errors name the file (truncated or not safetensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({e}); it may be truncated or corrupt: "
                              "fetch it again") from e
    with handle as f:
        yield f


def read_tensor(f: Any, file: Path, name: str) -> torch.Tensor:
    """Tensor ``name`` of the open file ``f``; absent or unreadable tensors name the file."""
    from safetensors import SafetensorError

    try:
        return f.get_tensor(name)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise read_error(f, file, name, e) from e


def open_slice(f: Any, file: Path, name: str) -> Any:
    """safetensors' lazy view of tensor ``name`` (its header only: shape and dtype, no data
    read); an absent tensor names the file as ``read_tensor`` does."""
    from safetensors import SafetensorError

    try:
        return f.get_slice(name)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise read_error(f, file, name, e) from e


def read_error(f: Any, file: Path, name: str, e: Exception) -> CheckpointError:
    """The error for tensor ``name`` of ``file`` failing to read: absent (the index was
    wrong) or unreadable (the file is damaged)."""
    if name not in set(f.keys()):
        return CheckpointError(f"{file}: has no tensor {name!r}, but {INDEX} says it holds it")
    return CheckpointError(f"{file}: tensor {name!r} could not be read ({e}); the file may be corrupt")
