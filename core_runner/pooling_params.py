"""PoolingParams: per-request settings of a pooling request, validated on construction.

``task``: what the request asks for (vLLM's ``PoolingParams.task``): ``"embed"``
  (one vector), ``"classify"`` (class probabilities), ``"score"`` (a pair's relevance) or
  ``"reward"`` (a reward model's raw scores: one per label at the last token, or one row
  per prompt token for a per-token reward head); ``None`` means the model's first task.
  ``LLM.embed`` / ``classify`` / ``score`` / ``reward`` set it.
``pooling_type``: how one vector is made from a prompt's final hidden states.
  ``None``   the model's default: the checkpoint's sentence-transformers pooling config
             (``1_Pooling/config.json``) when it has one, else the model's own default
             (BERT: mean, Qwen3 embedding: last; classifiers: their head's, CLS for
             BERT's pooler, last for a decoder's)
  ``"mean"`` the average over every prompt token (special tokens included, as
             sentence-transformers does with its attention mask)
  ``"cls"``  the first token's hidden state
  ``"last"`` the last token's hidden state (decoder embedders such as Qwen3-Embedding)
  ``"all"``  every prompt token's hidden state (vLLM's ALL): per-token reward heads only
``normalize``: L2-normalise the vector (default True; embed only).
``dimensions``: embed only, Matryoshka models only (vLLM's field): keep the first k
  entries of the pooled vector, then L2-normalise them when ``normalize`` is on. A model
  declares Matryoshka training by ``is_matryoshka`` / ``matryoshka_dimensions`` in its
  config.json or by its class (Qwen3-Embedding); k must be in (0, hidden_size] and, when
  the config lists ``matryoshka_dimensions``, one of them. None keeps every entry.
``use_activation``: classify / score / reward: apply the head's activation (softmax over
  the labels, or sigmoid when ``num_labels == 1`` or ``problem_type`` is
  ``multi_label_classification``); None means True for classify / score and False for
  reward (vLLM's reward pooler returns raw scores); False returns the raw logits.
  ``activation`` is vLLM's older name for the same switch; give one or equal values.
``truncate_prompt_tokens``: None keeps text prompts whole (a prompt over the limit is
  rejected); k >= 1 tokenizes text prompts with the tokenizer's own truncation at k tokens
  (special tokens such as [CLS]/[SEP] are kept, as sentence-transformers does); -1 means
  "the engine's limit". Token-id prompts are never cut: one longer than k is rejected,
  because only the caller knows where its special tokens are.
``compressed_token_type_ids``: vLLM's name for a sentence pair's token types: the index
  of the second segment's first token (every token from it on has type 1); None: all
  type 0. ``LLM.score`` sets it from the tokenizer's pair encoding.
"""
from __future__ import annotations

from dataclasses import dataclass

POOLING_TYPES = ("mean", "cls", "last", "all")
POOLING_TASKS = ("embed", "classify", "score", "reward")


@dataclass(slots=True, frozen=True)
class PoolingParams:
    pooling_type: str | None = None
    normalize: bool = True
    truncate_prompt_tokens: int | None = None
    task: str | None = None
    use_activation: bool | None = None
    activation: bool | None = None
    compressed_token_type_ids: int | None = None
    dimensions: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, valid: str) -> ValueError:
            return ValueError(f"PoolingParams.{name}={getattr(self, name)!r} is invalid: {valid}")

        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise bad("pooling_type", f"expected None (the model's default) or one of {POOLING_TYPES}")
        if not isinstance(self.normalize, bool):
            raise bad("normalize", "expected True or False")
        t = self.truncate_prompt_tokens
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or (t < 1 and t != -1)):
            raise bad("truncate_prompt_tokens", "expected None, -1 (the engine's limit) or an integer >= 1")
        if self.task is not None and self.task not in POOLING_TASKS:
            raise bad("task", f"expected None (the model's first task) or one of {POOLING_TASKS}")
        for name in ("use_activation", "activation"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise bad(name, "expected None, True or False")
        if None not in (self.use_activation, self.activation) and self.use_activation != self.activation:
            raise bad("activation", f"it contradicts use_activation={self.use_activation!r} (activation is "
                                    "the older name of use_activation: give one, or equal values)")
        c = self.compressed_token_type_ids
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 0):
            raise bad("compressed_token_type_ids", "expected None or an integer >= 0 (the index of the second "
                                                   "segment's first token)")
        d = self.dimensions
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 1):
            raise bad("dimensions", "expected None (every entry) or an integer >= 1 (Matryoshka truncation)")

    @property
    def activate(self) -> bool:
        """Whether classify / score / reward apply the head's activation (use_activation or
        activation; default True, False for reward)."""
        value = self.use_activation if self.use_activation is not None else self.activation
        return self.task != "reward" if value is None else value
