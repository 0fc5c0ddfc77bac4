"""Structured outputs: W2 with a JSON schema on every request vs W2 without (issue 41:
TPOT with the grammar <= 1.15x without).

Model: the Qwen3-0.6B shape on random (dummy) weights, with the conformance suite's
synthetic byte-level tokenizer of the same vocabulary (151,936 tokens: xgrammar needs
known token strings; ``core_runner.conformance.tokenizer.write_tokenizer``). One engine runs
both passes (plain first, then every request with ``StructuredOutputsParams(json=SCHEMA)``),
each after its own warm-up. EOS is ignored as in W2, so a plain request runs to its
max_tokens; a grammar request ends at max_tokens (``length``) or where the schema's
object closes (``stop``: the matcher terminated), so its outputs are not all W2's
lengths: compare TPOT (per output token, per request) first, tok/s second.

Reports TPOT p50 / mean and output tok/s both ways and their ratios, finish reasons, and
the fraction of the grammar-finished outputs that parse as JSON and carry the required
keys (``parsed_fraction``; should be 1.0).

    python3 benchmarks/so_bench.py [--num-requests N] [--json OUT]
    python3 benchmarks/so_bench.py --device cpu --dtype float32 --tiny --num-requests 6 --scale 16   # smoke
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from core_runner.bench.variants import workload_parser, write_json

# an object that a random model rarely closes: an unbounded array of strings after two fields
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["id", "name", "tags"]}
TINY = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)


def model_with_tokenizer(root: str | None, tiny: bool) -> str:
    from core_runner.bench.shapes import config_only_checkpoint, shape_config
    from core_runner.conformance.tokenizer import write_tokenizer

    # EOS is the synthetic tokenizer's (id 0, a special token), not the published config's id, which
    # is an ordinary token of that vocabulary: a grammar ends on EOS, and with ignore_eos the EOS
    # token stays in the output, so its text must be the empty special token's
    over = {**(TINY if tiny else {}), "eos_token_id": 0}
    path = Path(config_only_checkpoint("qwen3-0.6b", root, **{**over, "name_or_path": "so-bench-eos0"}))
    if not (path / "tokenizer.json").is_file():
        write_tokenizer(path, shape_config("qwen3-0.6b", **over))
    return str(path)


def run_pass(llm, workload, so) -> dict:
    from core_runner import SamplingParams
    from core_runner.bench.run import percentile

    eng = llm.engine

    def params(out_len: int, temp: float, seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=out_len, temperature=temp, ignore_eos=True, seed=seed,
                              structured_outputs=so)

    llm.generate([{"prompt_token_ids": p[:16]} for p, _, _ in workload[:8]],
                 [params(8, t, i) for i, (_, _, t) in enumerate(workload[:8])], use_tqdm=False)
    llm.reset_prefix_cache()
    start = time.perf_counter()
    for i, (prompt, out_len, temp) in enumerate(workload):
        eng.add_request(prompt, params(out_len, temp, i), req_id=f"s{i}")
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    elapsed = time.perf_counter() - start
    n_out = sum(len(o.token_ids) for o in outs)
    tpot = [(o.finish_time - o.first_token_time) / (len(o.token_ids) - 1) for o in outs if len(o.token_ids) > 1]
    reasons: dict[str, int] = {}
    for o in outs:
        reasons[o.finish_reason] = reasons.get(o.finish_reason, 0) + 1
    res = {"output_tok_s": n_out / elapsed, "elapsed_s": elapsed, "output_tokens": n_out,
           "requested_tokens": sum(o for _, o, _ in workload), "num_requests": len(outs),
           "tpot_p50_ms": 1e3 * percentile(tpot, 50), "tpot_p99_ms": 1e3 * percentile(tpot, 99),
           "tpot_mean_ms": 1e3 * statistics.fmean(tpot) if tpot else float("nan"), "finish_reasons": reasons}
    if so is not None:
        stopped = [o for o in outs if o.finish_reason == "stop"]
        ok = 0
        for o in stopped:
            try:
                obj = json.loads(o.text)
            except ValueError:
                continue
            ok += isinstance(obj, dict) and set(SCHEMA["required"]) <= set(obj)
        res["grammar_finished"] = len(stopped)
        res["parsed"] = ok
        res["parsed_fraction"] = ok / len(stopped) if stopped else float("nan")
        res["sample_text"] = (stopped[0].text if stopped else outs[0].text)[:200]
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = workload_parser(__doc__.split("\n")[0])
    a = ap.parse_args(argv)
    from core_runner.bench.variants import build_llm, release, variant_args
    from core_runner.bench.workloads import make_workload
    from core_runner.structured_outputs import StructuredOutputsParams

    model = model_with_tokenizer(a.root, a.tiny)
    llm = build_llm(model, variant_args(device=a.device, dtype=a.dtype))
    try:
        workload = make_workload("W2", llm.engine.vocab_size, a.num_requests, scale=a.scale)
        plain = run_pass(llm, workload, None)
        grammar = run_pass(llm, workload, StructuredOutputsParams(json=SCHEMA))
        plan = repr(llm.engine.plan)
    finally:
        release(llm)
    res = {"schema": SCHEMA, "plan": plan, "plain": plain, "json_schema": grammar,
           "tpot_p50_ratio": grammar["tpot_p50_ms"] / plain["tpot_p50_ms"],
           "tpot_mean_ratio": grammar["tpot_mean_ms"] / plain["tpot_mean_ms"],
           "tok_s_ratio": grammar["output_tok_s"] / plain["output_tok_s"]}
    for label, r in (("W2 plain", plain), ("W2 json schema", grammar)):
        print(f"{label}: {r['output_tok_s']:,.0f} output tok/s, TPOT p50 {r['tpot_p50_ms']:.2f} ms mean "
              f"{r['tpot_mean_ms']:.2f} ms ({r['output_tokens']:,} of {r['requested_tokens']:,} tokens, "
              f"{r['finish_reasons']})", flush=True)
    print(f"json / plain: TPOT p50 {res['tpot_p50_ratio']:.3f}x (target <= 1.15x), mean {res['tpot_mean_ratio']:.3f}x, "
          f"tok/s {res['tok_s_ratio']:.3f}x; grammar-finished {grammar['grammar_finished']}, parsed "
          f"{grammar['parsed']} ({grammar['parsed_fraction']:.2f})", flush=True)
    return write_json(a.json, res)


if __name__ == "__main__":
    main()
    sys.exit(0)
