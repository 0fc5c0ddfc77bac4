"""GPU smoke of prefix caching and n-gram speculation on a tiny float32 Qwen3: outputs and
per-step logits with each feature on must equal those with it off (CUDA graphs, Triton)."""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import build_checkpoint  # noqa: E402

from core_runner import LLM, SamplingParams  # noqa: E402


def run(llm, prompts, params):
    steps = llm.engine.debug.record_steps()
    outs = llm.generate(prompts, params, use_tqdm=False)
    logits = {}
    for s in steps:
        for r, lg in s.logits.items():
            logits.setdefault(r, []).append(lg)
    return [o.outputs[0].token_ids for o in outs], outs


def main() -> None:
    ck = build_checkpoint(Path(tempfile.mkdtemp()), "untied")
    kw = dict(device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8, block_size=16, num_kv_blocks=256)
    base = [(7 * i + 3) % 250 + 1 for i in range(70)]
    prompts = [base + [11, 12], base + [13], base[:40] + [14], [5, 6, 7, 8] * 12]
    g = SamplingParams(max_tokens=24, temperature=0.0)
    s = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=3)
    off = LLM(str(ck.path), enable_prefix_caching=False, **kw)
    want_g, _ = run(off, prompts, g)
    want_s, _ = run(off, prompts, s)
    on = LLM(str(ck.path), **kw)
    run(on, prompts[:1], g)
    got_g, outs = run(on, prompts, g)
    print("prefix cache: greedy equal", got_g == want_g, "hits", [o.num_cached_tokens for o in outs],
          "plan", on.engine.plan)
    spec = LLM(str(ck.path), speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                 "prompt_lookup_max": 3, "prompt_lookup_min": 1}, **kw)
    sg, outs = run(spec, prompts, g)
    print("ngram: greedy equal", sg == want_g, "proposed/accepted", [(o.num_draft_tokens, o.num_accepted_tokens)
                                                                     for o in outs])
    ss, _ = run(spec, prompts, s)
    print("ngram: seeded sampled equal", ss == want_s, "plan", spec.engine.plan)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
