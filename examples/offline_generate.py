"""Offline generation with the public API.

    python examples/offline_generate.py [--model PATH]

Without --model it uses the built-in demo checkpoint (random weights: gibberish text).
Shows strings and token-id prompts, one SamplingParams per prompt, and a seeded sample.
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
    prompts = ["The weather today is", "In the city of", [17, 42, 99]]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0),
        SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=7),
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
    ]
    for prompt, out in zip(prompts, llm.generate(prompts, params)):
        print(f"{prompt!r} -> {out.text!r} ({out.finish_reason}, seed {out.seed}, ids {out.token_ids})")


if __name__ == "__main__":
    main()
