"""``speculative_config``: vLLM's dict shape for speculative decoding, parsed and checked.

``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
"prompt_lookup_max": b}`` proposes, for each decoding request, the k tokens that followed
the most recent earlier occurrence of its last n tokens (n from b down to a) in its own
prompt and output. A bound left out takes the other's value, both 5 when neither is given
(vLLM's rule).

Draft-model methods (``core_runner.draft_model``): ``"mtp"`` runs the target checkpoint's
own next-token-prediction layers (DeepSeek-V3's ``num_nextn_predict_layers``; ``"model"``
left out, as the draft is in the target's checkpoint); ``"eagle"`` and ``"eagle3"`` load
a separate draft checkpoint from ``"model"`` (a local directory or a hub id). Proposals
are the draft's greedy tokens, so verification keeps a proposal with probability
p(proposal), which is speculative rejection sampling for a one-hot q.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DRAFT_METHODS = ("mtp", "eagle", "eagle3")
METHODS = ("ngram", *DRAFT_METHODS)
_KEYS = ("method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5

    @property
    def uses_draft_model(self) -> bool:
        return self.method in DRAFT_METHODS

    @classmethod
    def parse(cls, value: Any) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, or vLLM's dict; ValueError naming the bad key."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value

        def bad(key: str, got: object, valid: str) -> ValueError:
            return ValueError(f"speculative_config[{key!r}]={got!r} is invalid: {valid}")

        if not isinstance(value, dict):
            raise ValueError(f"speculative_config={value!r} is invalid: expected None or a dict such as "
                             "{'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_max': 4}")
        unknown = sorted(set(value) - set(_KEYS))
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}: expected some of {list(_KEYS)}")
        method = value.get("method")
        if method not in METHODS:
            raise bad("method", method, f"expected one of {list(METHODS)}")
        k = value.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise bad("num_speculative_tokens", k, f"expected an integer in 1..{MAX_SPECULATIVE_TOKENS}")
        model = value.get("model")
        if method in ("eagle", "eagle3"):
            if not isinstance(model, str) or not model:
                raise bad("model", model, f"method {method!r} needs the draft checkpoint's path or hub id")
        elif model is not None:
            raise bad("model", model, f"method {method!r} takes no draft model"
                      + (" (its draft layers are in the target's checkpoint)" if method == "mtp" else ""))
        if method != "ngram":
            for key in ("prompt_lookup_min", "prompt_lookup_max"):
                if value.get(key) is not None:
                    raise bad(key, value[key], f"only method 'ngram' looks up prompts; method {method!r} takes none")
            return cls(method, k, model)
        lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
        lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
        lo, hi = (5 if lo is None else lo), (5 if hi is None else hi)
        for key, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise bad(key, v, "expected an integer >= 1")
        if lo > hi:
            raise bad("prompt_lookup_min", lo, f"expected at most prompt_lookup_max={hi}")
        return cls(method, k, None, lo, hi)
