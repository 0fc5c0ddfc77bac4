"""Benchmark workloads and the random-weight Qwen3-0.6B-shaped checkpoint they run on.

Workloads (see DESIGN):

* ``W1``: 1024 requests, 128 prompt tokens, 256 output tokens each, greedy (temperature 0.0).
* ``W2``: 256 requests; for each request, in order, a prompt length then an output length, each
  ``randint(100, 1024)`` from a generator seeded with 0 (identical to ``random.seed(0)`` followed by
  ``random.randint`` calls, without touching the global generator); temperature 0.6.

* ``W3`` (shared prefixes, for prefix caching): 512 requests, each one of 8 system prompts of 1,000
  tokens followed by ``randint(50, 200)`` tokens of its own, 128 output tokens, greedy. One
  ``random.Random(0)`` draws the 8 system prompts, then per request, in order, which system prompt,
  the length of its own part and its tokens (``shared_prefix_workload``, vLLM's prefix-repetition
  dataset names: ``num_prefixes``, ``prefix_len``, ``suffix_len``, ``output_len``).

* ``W2R`` (repetitive prompts, for speculative decoding; the issue "W2 TPOT with n-gram on a
  repetitive-prompt variant"): W2's request count, lengths and temperature 0.6, but each prompt
  is one short segment repeated, so that n-gram prompt lookup finds its last tokens earlier in
  the prompt. A separate ``random.Random(0)`` draws, request by request, the segment length
  ``randint(8, 32)`` then its tokens from ``[3, vocab_size)``; the prompt is the segment repeated
  and cut to W2's prompt length. ``scale`` divides the segment length too (at least 4 tokens),
  so a smoke-sized prompt still repeats. A random-weight model does not continue the pattern
  and rarely repeats itself at temperature 0.6, so acceptance stays low there; sampled greedily
  (``temperature=0.0``, the bench's ``--temperature 0``) it falls into loops that n-gram
  lookup predicts: run both to bracket what speculation can give.

W1 and W2 prompt token ids are drawn from ``[3, vocab_size)`` by a separate ``random.Random(0)``,
request by request. EOS is ignored in every workload: every request must produce exactly its output
length.

``make_workload`` returns ``[(prompt_token_ids, output_len, temperature), ...]``. Asking for fewer
requests (``num_requests``) returns a prefix of the full workload; ``scale`` divides every length
(after drawing, so the draws do not change; W3's system prompt and own part each) to make smoke tests
cheap; ``temperature`` replaces every request's temperature.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

WORKLOADS = ("W1", "W2", "W2R", "W3")

_W1_DEFAULT_REQUESTS = 1024
_W1_PROMPT_LEN = 128
_W1_OUTPUT_LEN = 256
_W1_TEMPERATURE = 0.0

_W2_DEFAULT_REQUESTS = 256
_W2_MIN_LEN = 100
_W2_MAX_LEN = 1024
_W2_TEMPERATURE = 0.6

_W2R_SEGMENT_LEN = (8, 32)
_W2R_MIN_SCALED_SEGMENT = 4  # shorter, a scaled prompt would be a run of 1-2 tokens, unlike the real one

_W3_DEFAULT_REQUESTS = 512
_W3_NUM_PREFIXES = 8
_W3_PREFIX_LEN = 1000
_W3_SUFFIX_LEN = (50, 200)
_W3_OUTPUT_LEN = 128
_W3_TEMPERATURE = 0.0

_FIRST_TOKEN_ID = 3  # ids 0..2 are left out (special tokens in many vocabularies)

Request = tuple[list[int], int, float]


def make_workload(
    name: str,
    vocab_size: int,
    num_requests: int | None = None,
    *,
    scale: int = 1,
    temperature: float | None = None,
) -> list[Request]:
    """The named workload as ``[(prompt_token_ids, output_len, temperature), ...]``.

    ``num_requests`` overrides the workload's request count (a prefix of the full workload when
    smaller). ``scale`` divides prompt and output lengths (each at least 1); 1 is the real workload.
    ``temperature`` (0 is greedy) replaces the workload's.
    """
    key = name.strip().upper()
    if key not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(WORKLOADS)}")
    if vocab_size <= _FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size must be > {_FIRST_TOKEN_ID}, got {vocab_size}")
    if num_requests is not None and num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    if temperature is not None and not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    workload = _draw_workload(key, vocab_size, num_requests, scale)
    if temperature is not None:
        workload = [(prompt, out_len, float(temperature)) for prompt, out_len, _ in workload]
    return workload


def _draw_workload(key: str, vocab_size: int, num_requests: int | None, scale: int) -> list[Request]:
    if key == "W3":
        return shared_prefix_workload(vocab_size, _W3_DEFAULT_REQUESTS if num_requests is None else num_requests,
                                      scale=scale)
    if key == "W1":
        n = _W1_DEFAULT_REQUESTS if num_requests is None else num_requests
        shapes = [(_W1_PROMPT_LEN, _W1_OUTPUT_LEN)] * n
        temperature = _W1_TEMPERATURE
    else:
        n = _W2_DEFAULT_REQUESTS if num_requests is None else num_requests
        length_rng = random.Random(0)  # same stream as random.seed(0); random.randint(...)
        shapes = []
        for _ in range(n):
            prompt_len = length_rng.randint(_W2_MIN_LEN, _W2_MAX_LEN)
            output_len = length_rng.randint(_W2_MIN_LEN, _W2_MAX_LEN)
            shapes.append((prompt_len, output_len))
        temperature = _W2_TEMPERATURE

    token_rng = random.Random(0)
    if key == "W2R":
        return [(_repeated_prompt(token_rng, vocab_size, prompt_len, scale), max(1, output_len // scale), temperature)
                for prompt_len, output_len in shapes]
    workload: list[Request] = []
    for prompt_len, output_len in shapes:
        prompt = [token_rng.randrange(_FIRST_TOKEN_ID, vocab_size) for _ in range(prompt_len)]
        if scale > 1:
            prompt = prompt[: max(1, prompt_len // scale)]
            output_len = max(1, output_len // scale)
        workload.append((prompt, output_len, temperature))
    return workload


def _repeated_prompt(rng: random.Random, vocab_size: int, prompt_len: int, scale: int) -> list[int]:
    """W2R's prompt: a segment of ``randint(8, 32)`` tokens drawn from ``rng``, repeated to
    ``prompt_len`` tokens; ``scale`` divides both lengths after drawing."""
    segment = [rng.randrange(_FIRST_TOKEN_ID, vocab_size) for _ in range(rng.randint(*_W2R_SEGMENT_LEN))]
    if scale > 1:
        segment = segment[: max(_W2R_MIN_SCALED_SEGMENT, len(segment) // scale)]
        prompt_len = max(1, prompt_len // scale)
    return (segment * (prompt_len // len(segment) + 1))[:prompt_len]


def shared_prefix_workload(
    vocab_size: int,
    num_requests: int = _W3_DEFAULT_REQUESTS,
    *,
    num_prefixes: int = _W3_NUM_PREFIXES,
    prefix_len: int = _W3_PREFIX_LEN,
    suffix_len: tuple[int, int] = _W3_SUFFIX_LEN,
    output_len: int = _W3_OUTPUT_LEN,
    seed: int = 0,
    scale: int = 1,
) -> list[Request]:
    """W3's shape with its knobs: each request is one of ``num_prefixes`` shared system prompts of
    ``prefix_len`` tokens, then ``randint(*suffix_len)`` tokens of its own; ``output_len`` greedy
    output tokens. The system prompts are drawn first, so fewer requests give a prefix of the list.
    ``scale`` divides the system prompt and each own part after drawing (each at least 1 token)."""
    if vocab_size <= _FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size must be > {_FIRST_TOKEN_ID}, got {vocab_size}")
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if num_prefixes < 1 or prefix_len < 1 or output_len < 1:
        raise ValueError(f"num_prefixes, prefix_len and output_len must be >= 1, got {num_prefixes}, "
                         f"{prefix_len} and {output_len}")
    lo, hi = suffix_len
    if not 0 <= lo <= hi:
        raise ValueError(f"suffix_len must be a range (low, high) with 0 <= low <= high, got {suffix_len}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(_FIRST_TOKEN_ID, vocab_size) for _ in range(n)]

    prefixes = [draw(prefix_len)[: max(1, prefix_len // scale)] for _ in range(num_prefixes)]
    workload: list[Request] = []
    for _ in range(num_requests):
        prefix = prefixes[rng.randrange(num_prefixes)]
        n = rng.randint(lo, hi)
        own = draw(n)[: max(1, n // scale) if n else 0]
        workload.append((prefix + own, max(1, output_len // scale), _W3_TEMPERATURE))
    return workload


def workload_summary(workload: list[Request]) -> dict[str, Any]:
    """Counts and length ranges of a workload (for logs and JSON reports)."""
    if not workload:
        return {"num_requests": 0, "prompt_tokens": 0, "output_tokens": 0}
    prompt_lens = [len(p) for p, _, _ in workload]
    output_lens = [o for _, o, _ in workload]
    return {
        "num_requests": len(workload),
        "prompt_tokens": sum(prompt_lens),
        "output_tokens": sum(output_lens),
        "prompt_len_range": [min(prompt_lens), max(prompt_lens)],
        "output_len_range": [min(output_lens), max(output_lens)],
        "temperatures": sorted({t for _, _, t in workload}),
    }


# Qwen3-0.6B's shape. Token ids of the real tokenizer; dropped when a smaller vocab is asked for.
_QWEN3_0P6B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_bias=False,
    use_sliding_window=False,
    initializer_range=0.02,
)
_QWEN3_BOS = 151643
_QWEN3_EOS = 151645
_ROPE_THETA = 1_000_000.0


# Qwen3-32B's published shape (overrides of the 0.6B one): 64 layers, 64 q / 8 kv heads,
# hidden 5,120, intermediate 25,600, untied embeddings
QWEN3_32B = dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                 num_key_value_heads=8, tie_word_embeddings=False, rope_theta=1_000_000.0)


def qwen3_0p6b_config(**overrides: Any):
    """A ``transformers.Qwen3Config`` with Qwen3-0.6B's shape; keyword arguments override fields.

    ``rope_theta=...`` is accepted as an override and folded into ``rope_parameters``.
    """
    from transformers import Qwen3Config

    kwargs: dict[str, Any] = dict(_QWEN3_0P6B)
    rope_theta = float(overrides.pop("rope_theta", _ROPE_THETA))
    kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    kwargs["bos_token_id"] = _QWEN3_BOS
    kwargs["eos_token_id"] = _QWEN3_EOS
    kwargs.update(overrides)
    vocab = kwargs["vocab_size"]
    for key in ("bos_token_id", "eos_token_id"):
        if key not in overrides and kwargs[key] is not None and kwargs[key] >= vocab:
            kwargs[key] = None  # the real ids do not exist in a shrunken vocabulary
    if "num_key_value_heads" in kwargs and kwargs["num_key_value_heads"] is not None:
        if kwargs["num_attention_heads"] % kwargs["num_key_value_heads"]:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    config = Qwen3Config(**kwargs)
    config.architectures = ["Qwen3ForCausalLM"]
    return config


def tiny_qwen3_config(**overrides: Any):
    """A very small Qwen3 config for CPU smoke tests."""
    small = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    )
    small.update(overrides)
    return qwen3_0p6b_config(**small)


def make_random_checkpoint(
    path: str | Path,
    config,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> Path:
    """Build ``Qwen3ForCausalLM(config)`` with random weights and ``save_pretrained`` it to ``path``.

    The module is created on the meta device (no allocation, no init), materialised directly in
    ``dtype`` on ``device`` (default: CUDA when available, else CPU), then filled in place:
    linear and embedding weights ~ N(0, initializer_range), norms = 1. A 0.6B model takes
    a few seconds on a GPU and well under a minute on CPU.
    """
    from transformers import Qwen3ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)

    config.dtype = dtype  # recorded in config.json
    previous_default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # so that to_empty allocates directly in dtype
    try:
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous_default)
    # Non-persistent buffers (RoPE inv_freq) are left uninitialised here; they are not saved and
    # from_pretrained recomputes them, so only the parameters matter.
    model = model.to_empty(device=device).to(dtype)

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif param.dim() >= 2:
                param.normal_(mean=0.0, std=std, generator=gen)
            else:
                param.zero_()  # biases (Qwen3 has none by default)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()

    model.eval()
    model.save_pretrained(str(path))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return path


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/workloads.py --make-checkpoint DIR [--tiny] [--device cuda]``."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Write the random-weight benchmark checkpoint, or show a workload.")
    parser.add_argument("--make-checkpoint", metavar="DIR", help="write a random Qwen3-0.6B-shaped checkpoint here")
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen3 config instead (smoke tests)")
    parser.add_argument("--device", default=None, help="where to initialise the weights (default: cuda if present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summary", choices=WORKLOADS, type=str.upper, help="print a workload's summary")
    args = parser.parse_args(argv)
    if args.make_checkpoint:
        config = tiny_qwen3_config() if args.tiny else qwen3_0p6b_config()
        path = make_random_checkpoint(args.make_checkpoint, config, seed=args.seed, device=args.device)
        print(path)
    if args.summary:
        print(json.dumps(workload_summary(make_workload(args.summary, 151936))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
