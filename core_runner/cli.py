"""``core-runner`` command line: generate | plugins (more subcommands arrive with their issues)."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint directory (default: the built-in demo)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--strict", action="store_true", help="turn every plan downgrade into an error")
    p.add_argument("-v", "--verbose", action="store_true")


def _engine_options(a: argparse.Namespace) -> dict:
    opts = dict(device=a.device, dtype=a.dtype, max_model_len=a.max_model_len, max_num_seqs=a.max_num_seqs,
                max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size,
                num_kv_blocks=a.num_kv_blocks)
    if a.strict:
        opts["strict"] = True
    return opts


def cmd_generate(a: argparse.Namespace) -> int:
    from core_runner import LLM, SamplingParams

    model = a.model
    if model is None:
        from core_runner.demo import demo_checkpoint

        model = demo_checkpoint()
        print(f"# no --model given: using the built-in demo checkpoint {model} (random weights)", file=sys.stderr)
    llm = LLM(model, **_engine_options(a))
    params = SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k,
                            top_p=a.top_p, seed=a.seed, ignore_eos=a.ignore_eos)
    prompts = a.prompts or ["The weather today is"]
    outs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        if a.json:
            print(json.dumps({"prompt": prompt, "text": out.text, "token_ids": out.token_ids,
                              "finish_reason": out.finish_reason}))
        else:
            print(f"{prompt!r} -> {out.text!r} [{out.finish_reason}, {len(out.token_ids)} tokens]")
    return 0


def cmd_plugins(a: argparse.Namespace) -> int:
    from core_runner.plugins import load_plugins

    pm = load_plugins()
    rows = []
    for name, info in sorted(pm.plugins.items()):
        for reg in pm.registry.by_plugin(name):
            caps = {k: (c.state if not c.reason else f"{c.state}: {c.reason}") for k, c in reg.capabilities.items()}
            rows.append({"plugin": name, "version": info["version"], "architecture": reg.architecture,
                         "tasks": list(reg.tasks), "reference": reg.reference, "capabilities": caps})
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no core-runner plugins installed (entry-point group 'core_runner')")
    for r in rows:
        print(f"{r['plugin']} {r['version']}: {r['architecture']} tasks={','.join(r['tasks'])} "
              f"reference={r['reference']}")
        for k, v in sorted(r["capabilities"].items()):
            print(f"    {k:<18} {v}")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from core_runner.bench.run import bench

    results = bench(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="core-runner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts")
    _add_engine_args(g)
    g.add_argument("prompts", nargs="*", help="prompts (default: one demo prompt)")
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt")
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench", help="run workloads W1/W2 (DESIGN.md section 8)")
    b.add_argument("--model", default=None, help="checkpoint (default: random Qwen3-0.6B-shaped bf16)")
    b.add_argument("--workload", nargs="+", default=["W1", "W2"], choices=["W1", "W2"])
    b.add_argument("--num-requests", type=int, default=None, help="a prefix of the workload (smoke runs)")
    b.add_argument("--device", default="cuda")
    b.add_argument("--dtype", default="bfloat16")
    b.add_argument("--max-model-len", type=int, default=2048)
    b.add_argument("--max-num-seqs", type=int, default=1024)
    b.add_argument("--max-num-batched-tokens", type=int, default=8192)
    b.add_argument("--block-size", type=int, default=16)
    b.add_argument("--kv-fraction", type=float, default=0.8)
    b.add_argument("--enforce-eager", action="store_true")
    b.add_argument("--profile-steps", type=int, default=0, help="profile N decode steps for GPU idle time")
    b.add_argument("--peer", nargs="*", default=None, choices=["W1", "W2"],
                   help="also run the transformers peer (benchmarks/peers.py) on these workloads (none listed: all)")
    b.add_argument("--peer-timeout", type=int, default=900)
    b.add_argument("--json", default=None, help="write results here")
    b.add_argument("-v", "--verbose", action="store_true")
    b.set_defaults(func=cmd_bench)
    p = sub.add_parser("plugins", help="list installed plugins, architectures and capabilities")
    p.add_argument("--json", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_plugins)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, ImportError, RuntimeError) as e:
        print(f"core-runner: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
