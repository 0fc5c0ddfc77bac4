"""Routing checkpoint tensor names to parameters, and accounting for every part of every
parameter.

A model declares ``packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), ...}`` (a
checkpoint module name -> the fused module and the part it fills, first match wins),
``ignored_weight_patterns`` (regexes of names it does not use) and optionally
``map_weight_name(name) -> name | None``. A fused parameter lists the parts it is made of
in ``param.shard_ids`` (``core_runner.layers`` sets them); it is complete when loaded
whole (shard None) or when every listed part is loaded. A missing part is named by the
checkpoint tensor that would have filled it, so that an error reads
"model.layers.0.self_attn.v_proj.weight is missing", unless that name is ignored.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from core_runner.loader.files import CheckpointError


class WeightRouter:
    """Checkpoint tensor name -> (parameter name, shard id), or None for an ignored one."""

    def __init__(self, model: nn.Module) -> None:
        self.model_name = type(model).__name__
        self.packed: dict[str, tuple[str, object]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
        self.ignored = [re.compile(p) for p in getattr(model, "ignored_weight_patterns", ()) or ()]
        self.rename = getattr(model, "map_weight_name", None)

    def is_ignored(self, name: str) -> bool:
        return any(p.search(name) for p in self.ignored)

    def route(self, name: str) -> tuple[str, object] | None:
        target = self.rename(name) if self.rename else name
        if target is None or self.is_ignored(target):
            return None
        for src, (dst, shard_id) in self.packed.items():
            if f".{src}." in f".{target}":
                return f".{target}".replace(f".{src}.", f".{dst}.")[1:], shard_id
        return target, None

    def source_name(self, param: str, shard_id: object) -> str | None:
        """The (model-side) checkpoint name that fills part ``shard_id`` of ``param``."""
        for src, (dst, sid) in self.packed.items():
            if sid == shard_id and f".{dst}." in f".{param}":
                return f".{param}".replace(f".{dst}.", f".{src}.")[1:]
        return None


def _part(shard: object) -> str:
    return "" if shard is None else f" part {shard!r}"


class LoadedParts:
    """Which (parameter, shard) pairs the checkpoint filled, and from where."""

    def __init__(self, params: dict[str, nn.Parameter], router: WeightRouter) -> None:
        self.params, self.router = params, router
        self.seen: dict[str, dict[object, str]] = {}

    def record(self, param: str, shard: object, where: str) -> None:
        shards = self.seen.setdefault(param, {})
        prev = shards.get(shard)
        if prev is None and shards and (shard is None or None in shards):
            prev = next(iter(shards.values()))  # a whole tensor and a part of the same parameter
        if prev is not None:
            raise CheckpointError(
                f"{where} and {prev} both load parameter {param!r}{_part(shard)}: the checkpoint holds the same "
                "weights twice (e.g. a consolidated file beside the shards); remove one or add an index"
            )
        shards[shard] = where

    def missing(self) -> tuple[list[str], list[str]]:
        """(checkpoint tensors missing from fused parameters, parameters never loaded)."""
        tensors: list[str] = []
        unloaded: list[str] = []
        for name, param in self.params.items():
            got = self.seen.get(name, {})
            if None in got:
                continue
            ids = getattr(param, "shard_ids", None)
            if not ids:
                if not got:
                    unloaded.append(name)
                continue
            lacking = []
            for sid in ids:
                if sid in got:
                    continue
                src = self.router.source_name(name, sid)
                if src is None:
                    lacking.append(f"{name}{_part(sid)} (no packed_modules_mapping entry routes a tensor there)")
                elif not self.router.is_ignored(src):
                    lacking.append(src)
            if not got and not lacking:
                unloaded.append(name)  # every part ignored: nothing would fill it
            tensors.extend(lacking)
        return tensors, unloaded

    def check(self, path: str | Path) -> None:
        tensors, unloaded = self.missing()
        problems = []
        renamed = " (names as map_weight_name returns them)" if self.router.rename else ""
        if tensors:
            problems.append(
                f"{len(tensors)} tensor(s) that parts of fused parameters need are not in the checkpoint{renamed}: "
                f"{_some(tensors)}; a fused parameter is usable only with every part loaded"
            )
        if unloaded:
            problems.append(f"parameters of {self.router.model_name} not found in the checkpoint: {_some(unloaded)}")
        if problems:
            raise CheckpointError(
                f"checkpoint {str(path)!r}: " + "; ".join(problems)
                + " (a tensor the model does not need belongs in its ignored_weight_patterns)"
            )


def _some(names: list[Any], n: int = 8) -> str:
    return f"{names[:n]}{f' ... ({len(names)} in all)' if len(names) > n else ''}"
