"""Broken: the pooling plugin's per-token reward head served by a state that keeps only the
chunk ending a prompt (its earlier chunks' scores are dropped). Right when a prompt runs in
one step (CR-EQ-16's first batch); wrong as soon as chunked prefill splits a prompt."""
from core_runner import hookimpl
from model_states.reward import TokenRewardModelState


class ForgottenChunks(TokenRewardModelState):
    def pool(self, hidden_states, batch):
        for row in batch.idx_mapping_cpu[: batch.num_reqs].tolist():
            self.parts[row] = []  # the bug: a prompt's earlier chunks are forgotten
        return super().pool(hidden_states, batch)


@hookimpl
def register_models(registry):
    from core_runner_pooling.hooks import LLAMA_TOKEN_REWARD_CAPABILITIES, TINY_LLAMA

    registry.add(
        architecture="LlamaForTokenClassification",
        model="core_runner_pooling.llama_reward:LlamaForTokenClassification",
        model_state="conformance_fixtures.forgotten_reward_chunks:ForgottenChunks",
        capabilities=LLAMA_TOKEN_REWARD_CAPABILITIES, reference="transformers:LlamaForTokenClassification",
        tasks=("reward",), examples=[{"name": "tiny-llama-token-reward", "config": {**TINY_LLAMA, "num_labels": 2}}],
    )
