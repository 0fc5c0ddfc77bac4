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


def cmd_embed(a: argparse.Namespace) -> int:
    import torch

    from core_runner import LLM, PoolingParams

    opts = _engine_options(a)
    if a.max_model_len is None:  # LLM picks min(its default, the model's positions)
        del opts["max_model_len"]
    llm = LLM(a.model, **opts)
    params = PoolingParams(pooling_type=a.pooling_type, normalize=not a.no_normalize,
                           truncate_prompt_tokens=a.truncate)
    outs = llm.embed(a.prompts, params)
    vecs = torch.stack([o.embedding for o in outs])
    if a.similarity:
        unit = torch.nn.functional.normalize(vecs, dim=-1)
        sim = (unit @ unit.T).tolist()
        if a.json:
            print(json.dumps({"prompts": a.prompts, "similarity": sim}))
            return 0
        for i, (prompt, row) in enumerate(zip(a.prompts, sim)):
            print(f"[{i}] " + " ".join(f"{v:7.4f}" for v in row) + f"  {prompt!r}")
        return 0
    for prompt, out in zip(a.prompts, outs):
        e = out.embedding
        if a.json:
            print(json.dumps({"prompt": prompt, "embedding": e.tolist(), "num_tokens": len(out.prompt_token_ids)}))
            continue
        head = ", ".join(f"{v:.4f}" for v in e[: a.show].tolist())
        more = ", ..." if e.numel() > a.show else ""
        print(f"{prompt!r} -> [{head}{more}] (dim {e.numel()}, norm {float(e.norm()):.4f}, "
              f"{len(out.prompt_token_ids)} tokens)")
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
    if a.sampler:
        from core_runner.bench.sampler_bench import sampler_bench as bench
    elif a.embed:
        from core_runner.bench.embed_bench import embed_bench as bench
    else:
        from core_runner.bench.run import bench

    results = bench(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


def cmd_conformance(a: argparse.Namespace) -> int:
    """Run the conformance suite (a pytest session) against one plugin entry point."""
    import pytest

    args = ["--pyargs", "core_runner.conformance", "--cr-plugin", a.plugin, "--cr-tier", a.tier,
            "--cr-machine-examples", str(a.machine_examples), "-p", "no:cacheprovider", "-v" if a.verbose else "-q"]
    if a.json:
        args += ["--cr-json", a.json]
    if a.checks:
        args += ["--cr-checks", a.checks]
    if a.k:
        args += ["-k", a.k]
    if a.model:
        args += ["--cr-model", a.model]
    if a.dtype:
        args += ["--cr-dtype", a.dtype]
    return int(pytest.main(args))


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
    e = sub.add_parser("embed", help="embed texts with an embedding model (vectors or a similarity matrix)")
    _add_engine_args(e)
    e.set_defaults(max_model_len=None)
    e.add_argument("prompts", nargs="+", help="texts to embed")
    e.add_argument("--pooling-type", default=None, choices=["mean", "cls", "last"],
                   help="default: the checkpoint's sentence-transformers pooling, else the model's")
    e.add_argument("--no-normalize", action="store_true", help="print raw (not L2-normalised) vectors")
    e.add_argument("--truncate", type=int, default=None, help="truncate each text to N tokens (-1: the limit)")
    e.add_argument("--similarity", action="store_true", help="print the cosine similarity matrix instead")
    e.add_argument("--show", type=int, default=8, help="vector entries to print (default 8)")
    e.add_argument("--json", action="store_true", help="one JSON object per prompt (or one for --similarity)")
    e.set_defaults(func=cmd_embed)
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
    b.add_argument("--sampler", action="store_true",
                   help="time the sampler alone (1024 x 151936 fp32 logits, temperature + top-p) against a read "
                        "of the logits and torch softmax + multinomial")
    b.add_argument("--embed", action="store_true",
                   help="embedding throughput instead (core_runner/bench/embed_bench.py): sentences/s of "
                        "--model (default all-MiniLM-L6-v2) vs transformers; --num-requests sentences")
    b.add_argument("--embed-batch-size", type=int, default=256)
    b.add_argument("-v", "--verbose", action="store_true")
    b.set_defaults(func=cmd_bench)
    c = sub.add_parser("conformance", help="run the shared conformance suite against a plugin (docs/conformance.md)")
    c.add_argument("plugin", help="the plugin's entry-point name (see `core-runner plugins`)")
    c.add_argument("--json", default=None, help="write the report (checks, versions, capabilities) here")
    c.add_argument("--tier", default="auto", choices=["auto", "cpu", "gpu"],
                   help="cpu: skip GPU checks; gpu: require a GPU and run them; "
                        "auto (default): run them if CUDA is present")
    c.add_argument("--checks", default=None, help="comma-separated check ids or prefixes, e.g. CR-STATE,CR-EQ-01")
    c.add_argument("-k", default=None, help="pytest -k expression over the generated check names")
    c.add_argument("--machine-examples", type=int, default=12, help="Hypothesis examples for CR-STATE-06")
    c.add_argument("--model", default=None, metavar="PATH",
                   help="run the equivalence checks (default CR-EQ-01..04) on this checkpoint directory")
    c.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="engine dtype for --model (default float32; the reference is float32)")
    c.add_argument("-v", "--verbose", action="store_true")
    c.set_defaults(func=cmd_conformance)
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
