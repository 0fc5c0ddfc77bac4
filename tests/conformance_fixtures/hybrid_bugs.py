"""Mamba-hybrid corpus bugs: the Granite hybrid plugin's model, each with one bug of the
kind a plugin author writes and the registered examples hide (every example has one
B/C group, no time-step limit, a conv of width 4 and the same [mamba, attention, mamba,
mamba] layout)."""
from __future__ import annotations

import copy

from core_runner_granite_hybrid.model import GraniteMoeHybridForCausalLM

from core_runner.layers import GatedRMSNorm, Mamba2Mixer


def _mixers(model) -> list[Mamba2Mixer]:
    return [layer.mamba for layer in model.model.layers if layer.kind == "mamba"]


class GatedNormOverAllGroups(GraniteMoeHybridForCausalLM):
    """The Mamba output norm over the whole inner width, as if mamba_n_groups were 1 (the
    B/C projections do read the groups)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        width = int(config.mamba_expand * config.hidden_size)
        for mixer in _mixers(self):
            mixer.norm = GatedRMSNorm(width, width, config.rms_norm_eps, split=True)


class TimeStepLimitIgnored(GraniteMoeHybridForCausalLM):
    """dt is never clamped: the config's time_step_limit is not passed to the mixers."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for mixer in _mixers(self):
            mixer.dt_limit = (0.0, float("inf"))


class ConvBiasFromProjBias(GraniteMoeHybridForCausalLM):
    """The depthwise conv's bias flag read from mamba_proj_bias (copy-paste of the flag above)."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.mamba_conv_bias = bool(config.mamba_proj_bias)
        super().__init__(config)


class AttentionEveryFourth(GraniteMoeHybridForCausalLM):
    """Attention at layers 1, 5, 9, ... (the examples' period), Mamba elsewhere: layer_types
    is only checked for its length."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.layer_types = ["attention" if i % 4 == 1 else "mamba" for i in range(config.num_hidden_layers)]
        super().__init__(config)


class ConvWidthHardcoded(GraniteMoeHybridForCausalLM):
    """A causal conv of width 4 (every published Mamba2 checkpoint's), whatever mamba_d_conv says."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.mamba_d_conv = 4
        super().__init__(config)
