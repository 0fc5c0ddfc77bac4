"""Loading checkpoint tensors into a model's parameters.

Parameters carry a ``weight_loader(param, loaded, shard_id=None)``; routing and the
accounting of fused parts are in ``core_runner.loader.parts``. Each tensor is opened in
one place (the loop in ``load_weights``): routed, opened as a ``CheckpointSlice``
(headers only; a quantized weight's scale is checked there) and handed to its parameter.
After the last file every parameter, and every part of every fused one, must have been
filled.

What a weight loader receives. A tensor-parallel rank should read only its rows or
columns, so a loader that can take a lazy ``CheckpointSlice`` gets one and reads what it
narrows it to (``.shape``, ``.narrow``, then ``copy_into`` / ``materialize`` from
``core_runner.layers``, which call ``.load()``). Every other loader gets the whole tensor,
read, dequantized, cast to the parameter's dtype and device and checked finite, as it
always has. A loader takes slices when it says so with the function attribute
``accepts_checkpoint_slices = True`` (``False`` refuses them), or, saying nothing, when it
is defined in one of ``SLICE_AWARE_MODULES``: the modules of ``core_runner.layers`` whose
loaders use only that interface. Any other loader (a plugin's own, or a layer not yet
converted) is handed a tensor, so it keeps working unchanged; a plugin subclass that
overrides a layer's loader is handed a tensor too, even when it calls the parent's.
A parameter without a ``weight_loader`` is copied into whole.

``transform(name, tensor)`` (a seam for tests and for reshaping a tensor before it
reaches its parameter) sees whole tensors: with a transform every tensor is read whole,
dequantized, transformed, then cast and checked.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from core_runner.loader.checkpoint import checkpoint_files, open_safetensors
from core_runner.loader.files import CheckpointError
from core_runner.loader.finite import prepared, where
from core_runner.loader.kv_scales import KVScaleLoader
from core_runner.loader.parts import LoadedParts, WeightRouter
from core_runner.loader.slices import CheckpointSlice, open_checkpoint_slice
from core_runner.quantization import Quantization, TensorLookup, quantization_from_config
from core_runner.quantization.construction import building_for

# (checkpoint name, tensor) -> tensor: applied to each tensor routed to a parameter
Transform = Callable[[str, torch.Tensor], torch.Tensor]

# the function attribute by which a weight loader accepts (True) or refuses (False) lazy slices
ACCEPTS_SLICES = "accepts_checkpoint_slices"
# modules whose weight loaders touch what they are given only through .shape, .narrow,
# copy_into and materialize (default_weight_loader, which the plugins reuse, lives in linear)
SLICE_AWARE_MODULES = ("core_runner.layers.linear", "core_runner.layers.embedding", "core_runner.layers.fused_moe",
                       "core_runner.layers.mamba2")


def accepts_slices(loader: Any) -> bool:
    """Whether ``loader`` is handed a lazy ``CheckpointSlice`` (else a tensor); see the
    module docstring."""
    flag = getattr(loader, ACCEPTS_SLICES, None)  # a bound method shows its function's attributes
    if flag is not None:
        return bool(flag)
    return getattr(loader, "__module__", None) in SLICE_AWARE_MODULES


def _hand_over(param: nn.Parameter, loaded: torch.Tensor | CheckpointSlice, shard: object, target: str, file: Path,
               name: str) -> None:
    loader = getattr(param, "weight_loader", None)
    part = "" if shard is None else f" part {shard!r}"
    try:
        if loader is None:
            if shard is not None:
                raise ValueError(f"the parameter has no weight_loader, so it cannot take part {shard!r}")
            if param.shape != loaded.shape:
                raise ValueError(f"expected shape {tuple(param.shape)}")
            param.data.copy_(loaded)
        elif shard is None:
            loader(param, loaded)
        else:
            loader(param, loaded, shard)
    except CheckpointError:
        raise  # a slice read inside the loader failed: its error names file and tensor already
    except ValueError as e:
        raise CheckpointError(
            f"{where(file, name)} of shape {tuple(loaded.shape)} does not fit parameter {target!r}{part} "
            f"(shape {tuple(param.shape)}): {e}"
        ) from e


def load_weights(
    model: nn.Module, path: str | Path, transform: Transform | None = None, quantization: Quantization | None = None,
) -> None:
    """Fill every parameter of ``model`` from the checkpoint at ``path``. With ``quantization``
    its auxiliary tensors (fp8 block scales) are read with their weights, which it turns into
    the parameter's dtype before they reach the parameter. Loaders that accept slices read
    only the regions they keep (see the module docstring)."""
    path = Path(path)
    files = checkpoint_files(path)
    params = dict(model.named_parameters())
    router = WeightRouter(model)
    parts = LoadedParts(params, router)
    kv_scales = KVScaleLoader(model)  # fp8 KV cache scales go to layer buffers, not parameters
    lookup = TensorLookup(list(files)) if quantization is not None else None  # a scale may sit in another shard
    for file, names in files.items():
        with open_safetensors(file) as f:
            for name in names if names is not None else f.keys():
                if quantization is not None and quantization.is_auxiliary(name):
                    continue
                routed = router.route(name)
                if routed is None:
                    continue
                # the model-side name before packed_modules_mapping (k_proj.output_scale stays k_proj)
                if kv_scales.load(f, file, name, router.rename(name) if router.rename else name):
                    continue
                target, shard = routed
                param = params.get(target)
                if param is None:
                    raise CheckpointError(
                        f"{where(file, name)} (mapped to {target!r}) has no parameter in {router.model_name}; "
                        "add it to ignored_weight_patterns if it is unused"
                    )
                parts.record(target, shard, f"{file.name}:{name}")
                whole = open_checkpoint_slice(f, file, name, param, quantization, lookup)
                if transform is not None:
                    loaded = prepared(transform(name, whole.read()), getattr(param, "dense_dtype", param.dtype),
                                      param.device, file, name)
                elif accepts_slices(getattr(param, "weight_loader", None)):
                    loaded = whole
                else:
                    loaded = whole.load()
                _hand_over(param, loaded, shard, target, file, name)
    parts.check(path)


def build_model(
    model_cls: type, hf_config: Any, dtype: torch.dtype, device: str, path: str | Path,
    transform: Transform | None = None, load_format: str = "auto", seed: int = 0,
) -> nn.Module:
    """The model on ``device`` in ``dtype`` with the checkpoint's weights, or random ones
    with ``load_format="dummy"`` (``core_runner.loader.dummy``; no weight file is read)."""
    quantization = quantization_from_config(hf_config)  # an unknown method is refused before allocating
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        # layers that keep fp8 weights allocate them now (dummy weights too: random fp8 + scales)
        with torch.device(device), building_for(quantization):
            model = model_cls(hf_config)
    finally:
        torch.set_default_dtype(prev)
    if load_format == "dummy":
        from core_runner.loader.dummy import fill_dummy_weights

        fill_dummy_weights(model, seed, getattr(hf_config, "quantization_config", None))
    else:
        load_weights(model, path, transform, quantization)
    return model.eval()
