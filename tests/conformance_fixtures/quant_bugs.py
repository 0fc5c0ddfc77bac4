"""The Qwen3 plugin's model with one planted fp8 loading bug each. Both load unquantized
checkpoints exactly (every registered example passes CR-EQ-01); only a quantized
checkpoint shows them, so CR-EQ-18 must fail and name the module."""
from __future__ import annotations

from core_runner_qwen3.model import Qwen3ForCausalLM

from core_runner.layers import is_fp8


def _after_load(module, fix) -> None:
    """Run ``fix(module)`` after each load of ``module.weight`` (a region-reading loader, as
    the real one is, so the layer stays fp8)."""
    orig = module.weight.weight_loader

    def loader(param, loaded, shard_id=None):
        orig(param, loaded, shard_id)
        if is_fp8(module):
            fix(module)

    loader.accepts_checkpoint_slices = True
    module.weight.weight_loader = loader


def _transpose(module) -> None:
    scale = module.weight_scale_inv
    if scale.shape[0] == scale.shape[1]:
        scale.copy_(scale.t().clone())


def _first_row(module) -> None:
    module.weight_scale_inv.copy_(module.weight_scale_inv[:1].expand_as(module.weight_scale_inv).clone())


class ScaleTransposed(Qwen3ForCausalLM):
    """o_proj's block scales stored [in-blocks, out-blocks] (read as the kernel's K x N tile
    order): a square grid loads without a shape error, each block scaled by its mirror's."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for layer in self.model.layers:
            _after_load(layer.self_attn.o_proj, _transpose)


class ChannelScaleAsTensor(Qwen3ForCausalLM):
    """o_proj's per-channel scales taken as one per-tensor value (the first row's): exact for
    per-tensor checkpoints and block checkpoints whose scales happen to agree, wrong for
    compressed-tensors 'channel'."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for layer in self.model.layers:
            _after_load(layer.self_attn.o_proj, _first_row)


class BuiltDense(Qwen3ForCausalLM):
    """Builds every layer dense whatever the checkpoint holds ("fp8 loads fine": it does,
    dequantized at load, at twice the memory): the logits match, the residency check fails."""

    def __init__(self, config) -> None:
        from core_runner.quantization.construction import building_for

        with building_for(None):
            super().__init__(config)
