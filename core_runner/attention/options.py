"""Per-layer attention options: what a layer asks of the backend beyond causal softmax."""
from __future__ import annotations

import math
from dataclasses import dataclass

#: every option name a backend may list in ``AttentionBackend.attention_features``
ATTENTION_FEATURES = ("sliding_window", "logits_soft_cap", "sinks", "bidirectional_window")


def _check_window(name: str, w: object, least: int) -> None:
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < least):
        raise ValueError(f"{name}={w!r}: expected None or an int >= {least}")


@dataclass(frozen=True)
class AttentionOptions:
    """``sliding_window``: keys with p - window < k <= p (None: all); ``logits_soft_cap``:
    scores -> cap * tanh(scores / cap) (None: off); ``sinks``: the layer passes one learned
    logit per head that joins the softmax denominator; ``bidirectional_window``: for
    non-causal (encoder) layers, keys with |k - p| <= window (None: all), the symmetric
    window of ModernBERT's local layers (transformers: window = local_attention // 2).
    The two windows exclude each other: one is causal, the other is not."""

    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: bool = False
    bidirectional_window: int | None = None

    def __post_init__(self) -> None:
        _check_window("sliding_window", self.sliding_window, 1)
        # 0 is a real window: each token sees only itself
        _check_window("bidirectional_window", self.bidirectional_window, 0)
        if self.sliding_window is not None and self.bidirectional_window is not None:
            raise ValueError(f"sliding_window={self.sliding_window} and bidirectional_window="
                             f"{self.bidirectional_window} are both set: a layer is causal (sliding_window) or "
                             "bidirectional (bidirectional_window), not both")
        c = self.logits_soft_cap
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c)
                              or c <= 0):
            raise ValueError(f"logits_soft_cap={c!r}: expected None or a finite number > 0")

    @property
    def is_plain(self) -> bool:
        return not self.features()

    def features(self) -> frozenset[str]:
        out = set()
        if self.sliding_window is not None:
            out.add("sliding_window")
        if self.logits_soft_cap is not None:
            out.add("logits_soft_cap")
        if self.sinks:
            out.add("sinks")
        if self.bidirectional_window is not None:
            out.add("bidirectional_window")
        return frozenset(out)
