"""MoE corpus bugs: the Qwen3 plugin's Qwen3-MoE model, each with one bug of the kind a
plugin author writes and the registered examples hide (both examples renormalise the
top-k weights, sparsify every layer step 1, and untie the LM head)."""
from __future__ import annotations

import copy

import torch
from core_runner_qwen3.model import Qwen3MLP
from core_runner_qwen3.model_moe import Qwen3MoeForCausalLM, Qwen3MoeSparseBlock, is_sparse_layer


class MixtralRouting(Qwen3MoeSparseBlock):
    """Softmax over the k chosen logits (Mixtral's router): equal to Qwen3-MoE's routing only
    when norm_topk_prob renormalises the kept weights."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, ids = self.gate(x).float().topk(self.top_k, dim=-1)
        return self.experts(x, top.softmax(dim=-1), ids.to(torch.int32))


def _relayout(model: Qwen3MoeForCausalLM, config, sparse) -> None:
    """Give layer i a sparse block where ``sparse(i)``, a dense MLP elsewhere (before loading)."""
    for i, layer in enumerate(model.model.layers):
        if sparse(i) != isinstance(layer.mlp, Qwen3MoeSparseBlock):
            layer.mlp = (Qwen3MoeSparseBlock(config) if sparse(i)
                         else Qwen3MLP(config.hidden_size, config.intermediate_size))


class NormTopkProbIgnored(Qwen3MoeForCausalLM):
    """Mixtral's router in every sparse layer: norm_topk_prob=False is never honoured."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for layer in self.model.layers:
            if isinstance(layer.mlp, Qwen3MoeSparseBlock):
                layer.mlp.__class__ = MixtralRouting


class SparseStepOffByOne(Qwen3MoeForCausalLM):
    """A layer is sparse when layer_idx % decoder_sparse_step == 0 (transformers counts
    (layer_idx + 1)): the same layout for a step of 1, another for any other step."""

    def __init__(self, config) -> None:
        super().__init__(config)
        step = getattr(config, "decoder_sparse_step", 1) or 1
        only = getattr(config, "mlp_only_layers", None) or []
        _relayout(self, config, lambda i: i not in only and i % step == 0)


class MlpOnlyLayersIgnored(Qwen3MoeForCausalLM):
    """Every layer that decoder_sparse_step makes sparse is sparse: mlp_only_layers is not read."""

    def __init__(self, config) -> None:
        super().__init__(config)
        no_dense = copy.deepcopy(config)
        no_dense.mlp_only_layers = []
        _relayout(self, config, lambda i: is_sparse_layer(no_dense, i))


class TieIgnored(Qwen3MoeForCausalLM):
    """An LM head of its own whatever tie_word_embeddings says (the published MoE checkpoints
    are untied)."""

    def __init__(self, config) -> None:
        config = copy.deepcopy(config)
        config.tie_word_embeddings = False
        super().__init__(config)


class ExpertGateUpSwapped(Qwen3MoeForCausalLM):
    """Each expert's gate_proj is loaded as its up projection and up_proj as its gate (the
    w1 / w3 names of other checkpoints confused)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        mapping = dict(self.packed_modules_mapping)
        for name, (param, shard) in self.packed_modules_mapping.items():
            if isinstance(shard, tuple) and shard[1] in ("gate", "up"):
                mapping[name] = (param, (shard[0], "up" if shard[1] == "gate" else "gate"))
        self.packed_modules_mapping = mapping
