"""Broken: an embedding ModelState whose pooled vectors come out scaled by 1.01 (a wrong
mean divisor has the same effect), caught by CR-EQ-10 against the reference's hidden
states."""
from core_runner import hookimpl

BERT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=128, type_vocab_size=2, layer_norm_eps=1e-12,
    hidden_act="gelu",
)


@hookimpl
def register_models(registry):
    registry.add(
        architecture="BertModel", model="core_runner_pooling.bert:BertModel",
        model_state="conformance_fixtures.wrong_pooling_state:ScaledPoolingState",
        capabilities={"chunked_prefill": "unsupported", "async_scheduling": "supported"},
        reference="transformers:BertModel", tasks=("embed",), examples=[{"name": "tiny-bert", "config": BERT}],
    )
