"""Broken: the Qwen3 plugin's model with a logits smoothing meant per row that averages
over the batch dimension (``mean(dim=0)`` for ``mean(dim=-1)``): a request alone gets the
reference's logits, but in a batch every row is pulled toward the others. The grammar check
(CR-SO-01) sees it as a request without a grammar whose tokens change once grammar rows
share its batch."""
import torch
from core_runner_qwen3.model import Qwen3ForCausalLM

from conformance_fixtures import register_qwen3
from core_runner import hookimpl


class BatchMixedLogits(Qwen3ForCausalLM):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        return logits + 0.5 * (logits.mean(dim=0, keepdim=True) - logits)  # the bug: dim=0


@hookimpl
def register_models(registry):
    register_qwen3(registry, "conformance_fixtures.batch_mixed_logits:BatchMixedLogits")
