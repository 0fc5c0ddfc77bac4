"""Broken: the pooling plugin's BERT cross-encoder without ``uses_token_type_ids``, so the
engine never passes the pair's token types and the second segment is embedded as type 0.
Single texts are all type 0 anyway (CR-EQ-15 passes); a pair through the tokenizer's pair
template is scored wrongly (CR-EQ-17 fails)."""
from core_runner_pooling.bert import BertForSequenceClassification

from core_runner import hookimpl


class TokenTypesIgnored(BertForSequenceClassification):
    uses_token_type_ids = False  # the bug: the declaration left out


@hookimpl
def register_models(registry):
    from core_runner_pooling.hooks import BERT_CAPABILITIES, MS_MARCO_MINILM_L6_V2

    registry.add(
        architecture="BertForSequenceClassification",
        model="conformance_fixtures.score_token_types_ignored:TokenTypesIgnored",
        model_state="model_states.classify:ClassifyModelState", capabilities=BERT_CAPABILITIES,
        reference="transformers:BertForSequenceClassification", tasks=("classify", "score"),
        examples=[{"name": "ms-marco-minilm-l6-v2-shape", "config": MS_MARCO_MINILM_L6_V2}],
    )
