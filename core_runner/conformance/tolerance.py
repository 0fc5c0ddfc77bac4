"""How close the engine's logits must be to the reference's, per engine dtype.

float32 (the tiny examples, and ``--model`` with ``--dtype float32``): every logit within
1e-4 of the reference's, and a greedy divergence is a tie only where the reference's top-2
gap is under 2e-4.

bfloat16 / float16 (``--model`` with a low-precision engine; the reference stays float32):
single logits move by rounding in proportion to the row's scale, so an absolute bound on
raw logits either fails good models or passes bad ones. The measure is the largest
difference of log-softmax over the reference's top ``TOP_K`` tokens (the tokens that
decide sampling), in nats: independent of any shift of the row, and of the vocabulary
tail that rounding moves most. The bound (``LOW_PRECISION_NATS``) and the tie gap are
justified by a measurement, in docs/conformance.md ("Your checkpoint").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TOP_K = 8
LOW_PRECISION_NATS = {"bfloat16": 0.15, "float16": 0.05}
# the engine may be off by the bound on each of two tokens, so a top-2 gap under twice it is a tie
LOW_PRECISION_TIE = {k: 2 * v for k, v in LOW_PRECISION_NATS.items()}
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Tolerance:
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"conformance dtype {self.dtype!r} is not one of {list(DTYPES)}")

    @property
    def exact(self) -> bool:
        return self.dtype == "float32"

    @property
    def limit(self) -> float:
        return 1e-4 if self.exact else LOW_PRECISION_NATS[self.dtype]

    @property
    def tie(self) -> float:
        """A greedy divergence where the reference's top-2 gap is at most this is a near-tie."""
        return 2e-4 if self.exact else LOW_PRECISION_TIE[self.dtype]

    @property
    def measure(self) -> str:
        return "max |logit difference|" if self.exact else f"max |log-softmax difference| over the top {TOP_K}"

    def error(self, got: torch.Tensor, want: torch.Tensor) -> float:
        """The distance of one logits row (or a stack of rows) from the wanted one."""
        got, want = got.float(), want.float()
        if self.exact:
            return float((got - want).abs().max())
        top = want.topk(min(TOP_K, want.shape[-1]), dim=-1).indices
        diff = got.log_softmax(-1).gather(-1, top) - want.log_softmax(-1).gather(-1, top)
        return float(diff.abs().max())
