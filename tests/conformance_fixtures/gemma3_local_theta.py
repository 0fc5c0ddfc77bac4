"""Broken: Gemma3's sliding layers rope with base 10,000 whatever
rope_parameters['sliding_attention'] says (the published local base, so the examples
pass CR-EQ-01); CR-EQ-12 moves each layer kind's RoPE entry on its own and names it."""
from core_runner_gemma.hooks import CAPABILITIES, GEMMA3_ACCEPTED, TINY
from core_runner_gemma.model import Gemma3ForCausalLM

from core_runner import hookimpl
from core_runner.layers import RotaryEmbedding

EXAMPLE = {**TINY, "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}


class LocalThetaHardcoded(Gemma3ForCausalLM):
    def __init__(self, config) -> None:
        super().__init__(config)
        for layer, kind in zip(self.model.layers, config.layer_types):
            attn = layer.self_attn
            if kind == "sliding_attention":
                attn.rotary_emb = RotaryEmbedding(attn.head_dim, attn.head_dim, config.max_position_embeddings, 1e4)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="Gemma3ForCausalLM", model="conformance_fixtures.gemma3_local_theta:LocalThetaHardcoded",
        model_state="model_states.default:DefaultModelState", capabilities=CAPABILITIES,
        accepted_config=GEMMA3_ACCEPTED, reference="transformers:Gemma3ForCausalLM",
        examples=[{"name": "tiny", "config": EXAMPLE}],
    )
