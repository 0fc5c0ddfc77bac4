"""SamplingParams: per-request generation settings, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """How to generate for one request (vLLM-compatible names).

    temperature 0 is greedy. ``top_k`` -1 (or 0 via vLLM habit is rejected) means all
    tokens; ``top_p`` 1.0 means no nucleus cut. ``seed`` makes sampling reproducible
    whatever batch or row the request runs in; unseeded requests get a seed at add time.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, valid: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}={getattr(self, name)!r} is invalid: {valid}")

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad("max_tokens", "expected an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0.0:
            raise bad("temperature", "expected a number >= 0 (0 means greedy)")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise bad("top_k", "expected -1 (disabled) or an integer >= 1")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "expected a number in (0, 1]")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise bad("seed", "expected None or an integer in [0, 2**63)")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise bad("min_tokens", f"expected an integer in [0, max_tokens={self.max_tokens}]")
        ids = list(self.stop_token_ids)
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise bad("stop_token_ids", "expected a list of non-negative token ids")
        self.stop_token_ids = ids

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
