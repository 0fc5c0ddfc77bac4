"""Speculative decoding in ``core-runner bench``: the ``--speculative-config`` variants, the
acceptance counters of a timed run, and each variant compared with ``off``.

Definitions (vLLM's): a verification step checks one request's k proposed tokens; the
acceptance rate is accepted / proposed tokens, and the mean accepted length is
1 + accepted / verification steps (the tokens a step yields, the target's own included).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from core_runner.speculative_config import SpeculativeConfig

OFF = "off"


@dataclass(frozen=True)
class SpecVariant:
    label: str  # "off", or method and k: "ngram_k3", "mtp_k1" (a suffix when two would clash)
    config: dict[str, Any] | None  # vLLM's dict as given; None is no speculation


def spec_variants(given: list[str] | None) -> list[SpecVariant]:
    """``--speculative-config`` values (``off`` or vLLM's dict as JSON) in the order given,
    repeats dropped; none given is one run without speculation. A bad value is a ValueError
    naming it and, for a dict, the bad key."""
    if not given:
        return [SpecVariant(OFF, None)]
    variants: list[SpecVariant] = []
    seen: list[SpeculativeConfig | None] = []
    for value in given:
        config, parsed = _parse(value)
        if parsed in seen:
            continue
        seen.append(parsed)
        label = OFF if parsed is None else f"{parsed.method}_k{parsed.num_speculative_tokens}"
        taken = {v.label for v in variants}
        if label in taken:
            label = next(f"{label}_{i}" for i in range(2, len(given) + 2) if f"{label}_{i}" not in taken)
        variants.append(SpecVariant(label, config))
    return variants


def _parse(value: str) -> tuple[dict[str, Any] | None, SpeculativeConfig | None]:
    if value.strip().lower() == OFF:
        return None, None
    try:
        config = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config {value!r} is neither 'off' nor JSON ({e}); expected e.g. "
                         """'{"method": "ngram", "num_speculative_tokens": 3}'""") from None
    if not isinstance(config, dict):
        raise ValueError(f"--speculative-config {value!r} is not a JSON object: expected 'off' or vLLM's dict, "
                         """e.g. '{"method": "mtp", "num_speculative_tokens": 1}'""")
    try:
        return config, SpeculativeConfig.parse(config)
    except ValueError as e:
        raise ValueError(f"--speculative-config {value!r}: {e}") from None


def describe_spec(spec: SpeculativeConfig | None) -> dict[str, Any] | None:
    """What a run speculated with, as reported (the engine's parsed config, defaults filled)."""
    if spec is None:
        return None
    out: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method == "ngram":
        out.update(prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max)
    if spec.model is not None:
        out["model"] = spec.model
    return out


def spec_counters(scheduler) -> tuple[int, int, int]:
    """The scheduler's running totals: verification steps, proposed and accepted tokens."""
    return scheduler.spec_num_drafts, scheduler.spec_num_draft_tokens, scheduler.spec_num_accepted_tokens


def spec_metrics(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, Any]:
    """Acceptance over a timed run, from ``spec_counters`` taken before and after it (the
    warm-up's verifications are left out)."""
    drafts, proposed, accepted = (b - a for a, b in zip(before, after))
    return {
        "spec_num_drafts": drafts, "spec_num_draft_tokens": proposed, "spec_num_accepted_tokens": accepted,
        "acceptance_rate": accepted / proposed if proposed else math.nan,
        "mean_accepted_length": 1 + accepted / drafts if drafts else math.nan,
    }


def compare_spec(spec: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    """The same workload with a speculative variant and without (run_engine results that
    kept their outputs): TPOT, tok/s, acceptance, and how many requests' outputs agree;
    ``greedy_outputs_identical`` is set for a greedy workload, None for a sampled one."""
    n = len(off["output_token_ids"])
    same = sum(a == b for a, b in zip(spec["output_token_ids"], off["output_token_ids"]))
    return {
        "speculative_config": spec.get("speculative_config"),
        "tpot_mean_ms_off": off["tpot_mean_ms"], "tpot_mean_ms_spec": spec["tpot_mean_ms"],
        "tpot_spec_over_off": spec["tpot_mean_ms"] / off["tpot_mean_ms"] if off["tpot_mean_ms"] else math.nan,
        "tpot_p50_ms_off": off["tpot_p50_ms"], "tpot_p50_ms_spec": spec["tpot_p50_ms"],
        "output_tok_s_off": off["output_tok_s"], "output_tok_s_spec": spec["output_tok_s"],
        "output_tok_s_spec_over_off": spec["output_tok_s"] / off["output_tok_s"],
        "ttft_p50_s_off": off["ttft_p50_s"], "ttft_p50_s_spec": spec["ttft_p50_s"],
        "acceptance_rate": spec.get("acceptance_rate", math.nan),
        "mean_accepted_length": spec.get("mean_accepted_length", math.nan),
        "greedy": off["greedy"],
        "identical_outputs": same, "num_requests": n,
        "greedy_outputs_identical": same == n if off["greedy"] else None,
    }


def format_spec_line(r: dict[str, Any]) -> str:
    """One result's speculation line (run_engine with a speculative config)."""
    c = r["speculative_config"]
    return (f"  speculation {c.get('method')} k={c.get('num_speculative_tokens')}: acceptance "
            f"{100 * r['acceptance_rate']:.1f}% ({r['spec_num_accepted_tokens']:,} of {r['spec_num_draft_tokens']:,} "
            f"proposed), mean accepted length {r['mean_accepted_length']:.2f} over {r['spec_num_drafts']:,} "
            "verifications")


def format_spec_comparison(name: str, c: dict[str, Any]) -> str:
    same = (f"greedy outputs identical: {'yes' if c['greedy_outputs_identical'] else 'no'} "
            f"({c['identical_outputs']}/{c['num_requests']})" if c["greedy"]
            else f"identical sampled outputs {c['identical_outputs']}/{c['num_requests']}")
    return (f"{name} vs off: TPOT mean {c['tpot_mean_ms_spec']:.2f} vs {c['tpot_mean_ms_off']:.2f} ms "
            f"(spec/off {c['tpot_spec_over_off']:.3f}); {c['output_tok_s_spec']:,.0f} vs {c['output_tok_s_off']:,.0f} "
            f"output tok/s ({c['output_tok_s_spec_over_off']:.2f}x); acceptance {100 * c['acceptance_rate']:.1f}%, "
            f"mean accepted length {c['mean_accepted_length']:.2f}; {same}")
