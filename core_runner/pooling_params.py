"""PoolingParams: per-request settings of an embedding request, validated on construction.

``pooling_type``: how one vector is made from a prompt's final hidden states.
  ``None``   the model's default: the checkpoint's sentence-transformers pooling config
             (``1_Pooling/config.json``) when it has one, else the model's own default
             (BERT: mean, Qwen3 embedding: last)
  ``"mean"`` the average over every prompt token (special tokens included, as
             sentence-transformers does with its attention mask)
  ``"cls"``  the first token's hidden state
  ``"last"`` the last token's hidden state (decoder embedders such as Qwen3-Embedding)
``normalize``: L2-normalise the vector (default True).
``truncate_prompt_tokens``: None keeps text prompts whole (a prompt over the limit is
  rejected); k >= 1 tokenizes text prompts with the tokenizer's own truncation at k tokens
  (special tokens such as [CLS]/[SEP] are kept, as sentence-transformers does); -1 means
  "the engine's limit". Token-id prompts are never cut: one longer than k is rejected,
  because only the caller knows where its special tokens are.
"""
from __future__ import annotations

from dataclasses import dataclass

POOLING_TYPES = ("mean", "cls", "last")


@dataclass(slots=True, frozen=True)
class PoolingParams:
    pooling_type: str | None = None
    normalize: bool = True
    truncate_prompt_tokens: int | None = None

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
