"""Copies of a checkpoint directory with their tensors or JSON files changed, for the
loading tests; and a fake Hugging Face hub cache holding such directories."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file


def copy_checkpoint(src: str | Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_tensors(src: str | Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy of the single-file checkpoint ``src`` whose tensors ``edit`` changed in place."""
    copy_checkpoint(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def edit_json(dir_: Path, name: str, edit: Callable[[dict], None]) -> None:
    data = json.loads((dir_ / name).read_text())
    edit(data)
    (dir_ / name).write_text(json.dumps(data))


def fake_hub_repo(cache: Path, repo_id: str, revisions: dict[str, tuple[str, Path]]) -> Path:
    """``revisions``: ref name -> (commit sha, checkpoint dir). Lays out what
    snapshot_download leaves behind: models--org--name/{refs/<ref>, snapshots/<sha>/}."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for ref, (sha, src) in revisions.items():
        snap = repo / "snapshots" / sha
        if not snap.exists():
            shutil.copytree(src, snap)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(sha)
    return repo
