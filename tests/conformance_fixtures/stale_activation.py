"""Broken: the pooling plugin's Qwen3 classifier served by a state that writes a row's
``activate`` flag only when a request turns the activation off (rows start on), so a
request taking a row freed by a raw-logits one gets raw logits too. Right in fresh rows
(CR-EQ-15's first batches); wrong as soon as a row is reused (its chunked batches, where
short prompts finish first, and its reused-rows part)."""
import torch

from core_runner import hookimpl
from model_states.classify import ClassifyModelState


class StaleActivation(ClassifyModelState):
    def __init__(self, config, model, device) -> None:
        super().__init__(config, model, device)
        self.activate.gpu.fill_(1)

    def add_request(self, row, request) -> None:
        keep = self.activate.stage_scalar
        if request.pooling_params.activate:
            self.activate.stage_scalar = lambda *a: None  # the bug: "on" is never written
        try:
            super().add_request(row, request)
        finally:
            self.activate.stage_scalar = keep


@hookimpl
def register_models(registry):
    from core_runner_pooling.hooks import QWEN3_EMBED_CAPABILITIES, TINY_QWEN3

    registry.add(
        architecture="Qwen3ForSequenceClassification",
        model="core_runner_pooling.qwen3_embed:Qwen3ForSequenceClassification",
        model_state="conformance_fixtures.stale_activation:StaleActivation", capabilities=QWEN3_EMBED_CAPABILITIES,
        reference="transformers:Qwen3ForSequenceClassification", tasks=("classify", "score"),
        examples=[{"name": "tiny-qwen3-cls", "config": {**TINY_QWEN3, "num_labels": 2}}],
    )


assert torch  # the state's tensors are torch's
