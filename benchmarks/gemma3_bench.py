"""Gemma 3 at 8,192-token contexts: KV blocks held vs the sliding-window formula, and decode
tok/s vs the roofline (issue 41).

Model: the ``gemma-3-1b`` shape (google/gemma-3-1b-pt's text config at full size: 26
layers, 5 sliding-window layers to 1 global, 1 KV head of 256) on random (dummy) bf16
weights, window 1,024 by default (the issue's; the 1B publishes 512, the larger Gemma 3
models 1,024: ``--window 512`` for the 1B's own). Workload: NUM_REQUESTS (128) greedy
requests of CONTEXT - OUTPUT_LEN random prompt tokens and OUTPUT_LEN (256) output tokens,
EOS ignored, so each request ends at CONTEXT (8,192) tokens.

KV blocks: every 64 steps the distinct blocks each KV cache group holds
(``engine.debug.kv_cache_groups``), as tokens of KV over all layers, against
sum over running requests of (local layers x min(context, window) + global layers x
context): ``kv_ratio_to_formula`` (the last sample taken in pure decode, and every sample);
``kv_ratio_to_all_layers`` is the same against every layer holding the whole context.

Decode: the steps in which every request decodes (no prefill in the step), wall time per
step (steady state of the async loop), rows / time = ``decode_tok_s``; the roofline of each
such step streams the weights, each row's context of the global layers' KV and
min(context, window) of the local layers' KV at the measured copy bandwidth
(``decode_roofline_tok_s``; ``ratio_to_roofline``).

``--profile-steps N`` runs the workload once more, outside the clock, with N pure-decode
steps under the torch profiler (top kernels, GPU idle) and N under cProfile.

    python3 benchmarks/gemma3_bench.py [--num-requests 128] [--window 1024] [--profile-steps N] [--json OUT]
    python3 benchmarks/gemma3_bench.py --device cpu --dtype float32 --tiny   # smoke
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from core_runner.bench.variants import write_json

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16)
SAMPLE_EVERY = 64


class StepLog:
    """A step hook keeping, per step, the scheduled rows and their context after the step."""

    def __init__(self, prompt_len: int) -> None:
        self.prompt_len, self.steps = prompt_len, []

    def __call__(self, out) -> None:
        ctx = {rid: out.num_computed_tokens[rid] + n for rid, n in out.num_scheduled_tokens.items()}
        decode = all(n == 1 and out.num_computed_tokens[rid] >= self.prompt_len
                     for rid, n in out.num_scheduled_tokens.items())
        self.steps.append({"ctx": ctx, "decode": decode and bool(ctx)})


def want_sample(step: dict, n: int, context: int, kinds: set) -> bool:
    """Every SAMPLE_EVERY steps, the first pure-decode step and the first one with a row at
    its context's last tokens (the most KV held; 4 steps early: the rows must still run)."""
    kind = None
    if step["decode"]:
        kind = "last" if max(step["ctx"].values()) >= context - 4 else "first"
    if kind is not None and kind not in kinds:
        kinds.add(kind)
        return True
    return n % SAMPLE_EVERY == 0


def kv_sample(eng, ctx: dict[str, int], window: int, block_size: int) -> dict:
    groups = eng.debug.kv_cache_groups()
    held = sum(g["blocks_held"] * block_size * len(g["layers"]) for g in groups)
    n_local = sum(len(g["layers"]) for g in groups if g["sliding_window"] is not None)
    n_global = sum(len(g["layers"]) for g in groups if g["sliding_window"] is None)
    formula = sum(n_local * min(c, window) + n_global * c for c in ctx.values())
    return {"requests": len(ctx), "tokens_held_all_layers": held, "formula_tokens": formula,
            "all_layers_tokens": (n_local + n_global) * sum(ctx.values()),
            "kv_ratio_to_formula": held / formula if formula else float("nan"),
            "blocks_per_group": [{"sliding_window": g["sliding_window"], "layers": len(g["layers"]),
                                  "blocks_held": g["blocks_held"]} for g in groups]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--tiny", action="store_true", help="shrunk sizes (CPU smoke test; pass --context etc. too)")
    ap.add_argument("--root", default=None)
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch

    from core_runner import SamplingParams
    from core_runner.bench.run import copy_bandwidth
    from core_runner.bench.shapes import config_only_checkpoint
    from core_runner.bench.variants import build_llm, engine_facts, kv_read_split, release, variant_args, weight_bytes
    from core_runner.executor.gc_heap import paused_gc

    over = {**(TINY if a.tiny else {}), "sliding_window": a.window}
    model = config_only_checkpoint("gemma-3-1b", a.root, **over)
    args = variant_args(device=a.device, dtype=a.dtype, max_model_len=a.context)
    llm = build_llm(model, args)
    eng = llm.engine
    prompt_len = a.context - a.output_len
    rng = random.Random(0)
    prompts = [[rng.randrange(3, eng.vocab_size) for _ in range(prompt_len)] for _ in range(a.num_requests)]
    try:
        facts = engine_facts(llm)
        full_bpt, windowed = kv_read_split(llm)
        wbytes = weight_bytes(eng.model)
        bs = llm.config.block_size
        eng.dummy_run(min(llm.config.max_num_seqs, 64), llm.config.max_num_batched_tokens)
        llm.generate([{"prompt_token_ids": p[:32]} for p in prompts[:8]],
                     SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
        llm.reset_prefix_cache()
        cuda = eng.runner.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        log = StepLog(prompt_len)
        remove = eng.debug.on_step(log)
        samples, walls, skip, kinds = [], [], set(), set()
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            eng.add_request(p, SamplingParams(max_tokens=a.output_len, temperature=0.0, ignore_eos=True),
                            req_id=f"g{i}")
        outs = []
        with paused_gc():  # as LLM.generate runs (core_runner/executor/gc_heap.py)
            while eng.has_unfinished_requests():
                n0 = len(log.steps)
                t0 = time.perf_counter()
                outs += eng.step()
                walls += [time.perf_counter() - t0] * (len(log.steps) - n0)
                if len(log.steps) > n0 and want_sample(log.steps[-1], len(log.steps), a.context, kinds):
                    samples.append({**kv_sample(eng, log.steps[-1]["ctx"], a.window, bs),
                                    "step": len(log.steps) - 1, "decode": log.steps[-1]["decode"]})
                    skip.add(len(log.steps))  # the next step's wall time holds the sample's host work
            if cuda:
                torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        remove()
        bw = copy_bandwidth(a.device) if cuda else None
        found = profile_decode(eng, prompts, a, prompt_len) if a.profile_steps else None
    finally:
        release(llm)
    n_out = sum(len(o.token_ids) for o in outs)
    dec = [(i, s) for i, s in enumerate(log.steps) if s["decode"] and i not in skip]
    dec = dec[2:]  # the first decode steps still wait on the last prefill's results
    dec_time = sum(walls[i] for i, _ in dec)
    rows = sum(len(s["ctx"]) for _, s in dec)
    res = {"model": "gemma-3-1b shape (dummy weights)", "window": a.window, "published_window_1b": 512,
           "context": a.context, "num_requests": a.num_requests, "output_len": a.output_len, "engine": facts,
           "kv_full_bytes_per_token": full_bpt, "kv_windowed_bytes_per_token": windowed, "weight_bytes": wbytes,
           "output_tok_s": n_out / elapsed, "elapsed_s": elapsed, "output_tokens": n_out, "steps": len(log.steps),
           "decode_steps_timed": len(dec), "decode_tok_s": rows / dec_time if dec_time else float("nan"),
           "decode_step_ms_mean": 1e3 * dec_time / len(dec) if dec else float("nan"), "kv_samples": samples}
    if found is not None:
        res["profile"] = found
    in_decode = [s for s in samples if s["decode"]]
    last = (in_decode or samples or [{}])[-1]
    res["kv_ratio_to_formula"] = last.get("kv_ratio_to_formula", float("nan"))
    res["kv_ratio_to_all_layers"] = (last["tokens_held_all_layers"] / last["all_layers_tokens"]
                                     if last.get("all_layers_tokens") else float("nan"))
    if bw:
        roof_time = sum((wbytes + sum(full_bpt * c + sum(b * min(c, w) for w, b in windowed)
                                      for c in s["ctx"].values())) / bw for _, s in dec)
        res.update(copy_bw_gb_s=bw / 1e9, roofline_tok_s=rows / roof_time if roof_time else float("nan"),
                   ratio_to_roofline=roof_time / dec_time if dec_time else float("nan"))
    print(f"gemma3 ({a.num_requests} x {a.context} tokens, window {a.window}): {res['output_tok_s']:,.0f} output tok/s "
          f"overall; decode {res['decode_tok_s']:,.0f} tok/s over {len(dec)} pure-decode steps "
          f"({res['decode_step_ms_mean']:.2f} ms each)"
          + (f", roofline {res['roofline_tok_s']:,.0f} tok/s: ratio {res['ratio_to_roofline']:.2f}" if bw else ""))
    print(f"gemma3 KV held {last.get('tokens_held_all_layers', 0):,} layer-tokens vs formula "
          f"{last.get('formula_tokens', 0):,} (local x min(ctx, window) + global x ctx): "
          f"{res['kv_ratio_to_formula']:.3f}x; vs every layer holding the context {res['kv_ratio_to_all_layers']:.3f}x",
          flush=True)
    if found is not None:
        from core_runner.bench.profile import host_lines, kernel_lines

        print(f"  profiled decode steps: GPU idle {found.get('gpu_idle_frac', float('nan')):.1%}, busy "
              f"{found.get('gpu_busy_ms_per_step', float('nan')):.2f} ms a step", flush=True)
        print("\n".join(kernel_lines(found.get("top_kernels", [])[:12], "")
                        + host_lines(found.get("host_top", [])[:8], "host")), flush=True)
    return write_json(a.json, res)


def profile_decode(eng, prompts: list[list[int]], a, prompt_len: int) -> dict:
    """``a.profile_steps`` decode steps of the same workload, after every prompt's prefill."""
    from core_runner import SamplingParams
    from core_runner.bench.profile import profile_pass

    params = SamplingParams(max_tokens=a.output_len, temperature=0.0, ignore_eos=True)

    def add_all(prefix: str) -> None:
        for i, p in enumerate(prompts):
            eng.add_request(p, params, req_id=f"{prefix}{i}")

    budget = eng.config.max_num_batched_tokens
    prefill_steps = -(-len(prompts) * prompt_len // budget)
    return profile_pass(eng, add_all, a.profile_steps,
                        prof_at=min(prefill_steps + 4, prefill_steps + a.output_len // 2))


if __name__ == "__main__":
    main()
    sys.exit(0)
