"""Per-layer attention options: what a layer asks of the backend beyond causal softmax."""
from __future__ import annotations

import math
from dataclasses import dataclass

#: every option name a backend may list in ``AttentionBackend.attention_features``
ATTENTION_FEATURES = ("sliding_window", "logits_soft_cap", "sinks")


@dataclass(frozen=True)
class AttentionOptions:
    """``sliding_window``: keys with p - window < k <= p (None: all); ``logits_soft_cap``:
    scores -> cap * tanh(scores / cap) (None: off); ``sinks``: the layer passes one learned
    logit per head that joins the softmax denominator."""

    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: bool = False

    def __post_init__(self) -> None:
        w = self.sliding_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"sliding_window={w!r}: expected None or an int >= 1")
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
        return frozenset(out)
