"""MLA corpus bugs: the DeepSeek plugin's V2 / V3 models, each with one bug of the kind a
plugin author writes and the registered examples hide (the router's correction bias is
a zero buffer in every reference, V3's examples renormalise, keep one shared expert and
the interleaved RoPE, and YaRN's two mscales are equal wherever they are set)."""
from __future__ import annotations

import copy

import torch
from core_runner_deepseek.model import DeepseekMoE, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

from core_runner.layers import tensor_model_parallel_all_reduce, yarn_softmax_scale
from core_runner.layers.moe_routing import grouped_topk_v3
from core_runner.layers.rope_config import rope_parameters_of, yarn_get_mscale


def _moe_layers(model) -> list[DeepseekMoE]:
    return [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, DeepseekMoE)]


def _retype(model, cls: type) -> None:
    """Every MoE block of ``model`` behaves as ``cls`` (a DeepseekMoE subclass that only
    overrides methods: its parameters stay those the real block built)."""
    for moe in _moe_layers(model):
        moe.__class__ = cls


class BiasIgnoredMoE(DeepseekMoE):
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grouped_topk_v3(self.gate(x), None, self.top_k, self.n_group, self.topk_group, self.norm_topk_prob,
                               self.scaling)


class CorrectionBiasIgnored(DeepseekV3ForCausalLM):
    """e_score_correction_bias is loaded and never used: experts are chosen by the plain
    sigmoid scores (right while the bias is zero)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        _retype(self, BiasIgnoredMoE)


class BiasInWeightsMoE(DeepseekMoE):
    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(x)
        bias = self.gate.e_score_correction_bias
        _, ids = grouped_topk_v3(logits, bias, self.top_k, self.n_group, self.topk_group, self.norm_topk_prob)
        weights = (logits.float().sigmoid() + bias).gather(1, ids.long())
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scaling, ids


class CorrectionBiasInWeights(DeepseekV3ForCausalLM):
    """The correction bias steers the choice, as it should, and also goes into the weights
    of the chosen experts (they must be the unbiased scores)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        _retype(self, BiasInWeightsMoE)


class NormTopkProbIgnored(DeepseekV3ForCausalLM):
    """V3's routed weights are always renormalised, whatever norm_topk_prob says."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for moe in _moe_layers(self):
            moe.norm_topk_prob = True


class SharedExpertsAssumedOne(DeepseekV3ForCausalLM):
    """One shared expert (V3's published count) whatever n_shared_experts says."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        if getattr(config, "n_shared_experts", None):
            config.n_shared_experts = 1
        super().__init__(config)


class RopeInterleaveIgnored(DeepseekV3ForCausalLM):
    """V3 ropes interleaved pairs as V2 does, whatever rope_interleave says."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.rope_interleave = True
        super().__init__(config)


class SoftmaxScaleFromMscale(DeepseekV2ForCausalLM):
    """YaRN's softmax-scale correction computed from rope_scaling's ``mscale`` where
    transformers reads ``mscale_all_dim`` (DeepSeek's published configs set both equal)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        params = rope_parameters_of(config)
        for layer in self.model.layers:
            attn = layer.self_attn
            scale = yarn_softmax_scale(config, attn.nope + attn.rope)
            if params["rope_type"] != "default" and params.get("mscale_all_dim"):
                m = yarn_get_mscale(float(params["factor"]), float(params.get("mscale", 1.0)))
                scale = float(attn.nope + attn.rope) ** -0.5 * m * m
            attn.attn.scale = scale


class ScaledSharedMoE(DeepseekMoE):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, *self.route(x))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x) * self.scaling
        return tensor_model_parallel_all_reduce(out)


class RoutedScalingOnShared(DeepseekV3ForCausalLM):
    """routed_scaling_factor applied to the whole MoE output, shared experts included (it
    scales the routed experts only)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        _retype(self, ScaledSharedMoE)
