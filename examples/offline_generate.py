"""Offline generation with the public API (vLLM's names and output shape).

    python examples/offline_generate.py [--model PATH]

Without --model it uses the built-in demo checkpoint (a tiny model trained on English text).
Shows the prompt forms (text, token ids, prompt dicts), one SamplingParams per prompt, a
seeded sample, n samples of one prompt and logprobs.
"""
from __future__ import annotations

import argparse

from core_runner import LLM, SamplingParams
from core_runner.demo import demo_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    llm = LLM(args.model or demo_checkpoint(), dtype="float32", device="cpu",
              max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, block_size=16)
    prompts = ["The weather today is", {"prompt": "In the city of"}, [17, 42, 99], {"prompt_token_ids": [5, 6]}]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0),
        SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7),
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=3, ignore_eos=True),
    ]
    for out in llm.generate(prompts, params, use_tqdm=False):
        shown = out.prompt if out.prompt is not None else out.prompt_token_ids
        for c in out.outputs:
            print(f"{out.request_id} {shown!r} [{c.index}] -> {c.text!r} ({c.finish_reason}, ids {c.token_ids})")
            if c.logprobs:
                first = c.logprobs[0]
                print("   first token's top logprobs:",
                      {t: (round(lp.logprob, 3), lp.rank, lp.decoded_token) for t, lp in first.items()})


if __name__ == "__main__":
    main()
