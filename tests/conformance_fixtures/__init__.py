"""Deliberately broken plugin variants. Most register LlamaForCausalLM (the model of
examples/plugin_template) with one bug, and tests/test_conformance_fixtures.py checks
that the conformance suite reports it under the right check id. ``offsets.py`` holds
the models and states they share; the correct state (``good_offsets``) passes the
checks the broken ones fail.

The planted-bug corpus (``corpus.py``: ``dense_*``, ``moe_*``, ``mla_*``, ``hybrid_*``,
``pooling_*`` with their ``*_bugs.py`` and one ``control_*`` per family) registers the real
plugins' architectures as they register them, each with one realistic bug;
tests/test_conformance_corpus.py says which check must catch each one."""
from __future__ import annotations

TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-5, rope_theta=10000.0,
)
LLAMA = "core_runner_llama_template.model:LlamaForCausalLM"
DEFAULT_STATE = "model_states.default:DefaultModelState"
OFFSETS = "conformance_fixtures.offsets:"
QWEN3_BUGS = "conformance_fixtures.qwen3_bugs:"  # the Qwen3 plugin's model with planted bugs


def register(registry, model: str, model_state: str, **capabilities: str) -> None:
    caps = {"chunked_prefill": "supported", "async_scheduling": "supported", **capabilities}
    registry.add(
        architecture="LlamaForCausalLM", model=model, model_state=model_state, capabilities=caps,
        reference="transformers:LlamaForCausalLM", examples=[{"name": "tiny", "config": dict(TINY)}],
    )


def register_qwen3(registry, model: str, declare_limits: bool = True) -> None:
    """Qwen3ForCausalLM as the Qwen3 plugin registers it, with one tiny example, built by
    ``model``; ``declare_limits=False`` leaves out the plugin's ``accepted_config``."""
    from core_runner_qwen3.hooks import ACCEPTED_CONFIG, CAPABILITIES, TINY

    registry.add(
        architecture="Qwen3ForCausalLM", model=model, model_state=DEFAULT_STATE, capabilities=CAPABILITIES,
        reference="transformers:Qwen3ForCausalLM", accepted_config=ACCEPTED_CONFIG if declare_limits else None,
        examples=[{"name": "tiny", "config": {**TINY, "tie_word_embeddings": False}}],
    )


def register_granite(registry, model_state: str = "model_states.mamba_hybrid:MambaHybridModelState",
                     **capabilities: str) -> None:
    """The Granite hybrid as its plugin registers it (one dense tiny example, no experts, no
    RoPE), served by ``model_state``, with ``capabilities`` overriding the plugin's
    declarations."""
    from core_runner_granite_hybrid.hooks import CAPABILITIES, TINY

    registry.add(
        architecture="GraniteMoeHybridForCausalLM",
        model="core_runner_granite_hybrid.model:GraniteMoeHybridForCausalLM",
        model_state=model_state,
        capabilities={**CAPABILITIES, **capabilities}, reference="transformers:GraniteMoeHybridForCausalLM",
        examples=[{"name": "tiny-dense-nope", "config": {**TINY, "num_local_experts": 0,
                                                         "position_embedding_type": None}}],
    )


def register_qwen3_embed(registry, model_state: str) -> None:
    """The pooling plugin's Qwen3 embedding model (chunked prefill supported) with one tiny
    example, served by ``model_state``."""
    from core_runner_pooling.hooks import QWEN3_EMBED_CAPABILITIES, TINY_QWEN3

    registry.add(
        architecture="Qwen3Model", model="core_runner_pooling.qwen3_embed:Qwen3EmbeddingModel",
        model_state=model_state, capabilities=QWEN3_EMBED_CAPABILITIES, reference="transformers:Qwen3Model",
        tasks=("embed",), examples=[{"name": "tiny-qwen3-embed", "config": dict(TINY_QWEN3)}],
    )
