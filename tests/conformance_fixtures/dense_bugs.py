"""Dense corpus bugs: the Qwen3 plugin's model and the Llama template's, each with one bug
of the kind a plugin author writes and the registered examples hide (no example has RoPE
scaling on Qwen3, one eps serves every norm, Llama 3's band factors are always 1 and 4)."""
from __future__ import annotations

import copy

from core_runner_llama_template.model import LlamaForCausalLM
from core_runner_qwen3.model import Qwen3ForCausalLM

from core_runner.layers import RMSNorm, RotaryEmbedding, get_rope, rope_theta_of
from core_runner.layers.rope_config import rope_parameters_of


def _attentions(model) -> list:
    return [layer.self_attn for layer in model.model.layers]


class RopeScalingIgnored(Qwen3ForCausalLM):
    """Plain RoPE from rope_theta: the config's rope scaling (YaRN, linear, dynamic, the
    long-context settings Qwen3 publishes) is never looked at."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for attn in _attentions(self):
            attn.rotary_emb = RotaryEmbedding(attn.head_dim, attn.head_dim, config.max_position_embeddings,
                                              rope_theta_of(config))


class QkNormEpsHardcoded(Qwen3ForCausalLM):
    """The per-head q/k norms use eps 1e-6 (Qwen3's published value), not rms_norm_eps."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for attn in _attentions(self):
            attn.q_norm = RMSNorm(attn.head_dim, 1e-6)
            attn.k_norm = RMSNorm(attn.head_dim, 1e-6)


class AttentionBiasIgnored(Qwen3ForCausalLM):
    """"Qwen3 has no attention bias": q/k/v/o are built without one whatever attention_bias says."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.attention_bias = False
        super().__init__(config)


class Llama3BandsHardcoded(LlamaForCausalLM):
    """Llama 3 RoPE scaling with the factor and original_max_position_embeddings read from the
    config but the band edges hard-coded (low_freq_factor 1, high_freq_factor 4, as Llama 3
    publishes them)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        params = dict(rope_parameters_of(config))
        if params["rope_type"] != "llama3":
            return
        fixed = copy.deepcopy(config)
        fixed.rope_parameters = {**params, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        for attn in _attentions(self):
            attn.rotary_emb = get_rope(fixed, attn.head_dim)


class ActivationAssumedSilu(LlamaForCausalLM):
    """SiLU whatever hidden_act says, with no refusal of other activations."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.hidden_act = "silu"
        super().__init__(config)
