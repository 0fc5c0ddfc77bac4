"""``core-runner`` command line: generate | embed | serve | bench | plugins | conformance.

Engine options left out take the same defaults as ``LLM()`` (from the model and the device)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Sequence

from core_runner.bench.shapes import SHAPES  # names only: the module imports no torch

# what `core-runner serve` with no model calls the demo checkpoint (in /v1/models and requests' "model")
DEMO_SERVED_NAME = "demo"
# engine flags whose default (None) means "as LLM() chooses"; forwarded only when given
_ENGINE_FLAGS = ("device", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
                 "num_kv_blocks", "gpu_memory_utilization", "kv_cache_memory_fraction", "generation_config", "revision",
                 "tokenizer_revision", "tensor_parallel_size", "nnodes", "master_addr", "master_port",
                 "speculative_config", "max_cudagraph_capture_size", "kv_cache_dtype")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default; engine flags say in their help what their None default means."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS:
            return text
        if not action.option_strings:
            return text
        if action.default is None:
            return text + " (default: none)"
        return super()._get_help_string(action)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("core-runner")
    except PackageNotFoundError:
        from core_runner import __version__

        return __version__


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF checkpoint directory (default: the built-in demo)")
    p.add_argument("--revision", default=None, help="a hub model id's branch, tag or commit (default: main)")
    p.add_argument("--tokenizer-revision", default=None, help="(default: --revision)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (default: auto, cuda when present)")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "float16", "bfloat16"],
                   help="(default: auto, the checkpoint's dtype on a GPU, float32 on the CPU)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="(default: min(2048, the model's max_position_embeddings))")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="requests per step (default: from the device: 1024 on a >= 70 GiB GPU, 256 on a "
                        "smaller one, 64 on the CPU)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step (default: from the device: 8192 / 2048 / 2048, at least max-model-len)")
    p.add_argument("--block-size", type=int, default=None, help="KV page size in tokens (default: 16)")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="(default: sized from memory)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="fraction of the GPU's memory for weights + activations + KV (default: 0.9 on CUDA)")
    p.add_argument("--kv-cache-memory-fraction", type=float, default=None,
                   help="fraction of the host's free memory for the KV pool (default: 0.5 on the CPU)")
    p.add_argument("--generation-config", default=None, choices=["auto", "vllm"],
                   help="auto: sampling defaults from the checkpoint's generation_config.json; vllm: ignore "
                        "them (default: auto)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=None,
                   help="split the model over N ranks (GPUs cuda:0..N-1 per node, or CPU processes) (default: 1)")
    p.add_argument("--enable-expert-parallel", action="store_true",
                   help="MoE layers keep whole experts per rank instead of a slice of every expert")
    p.add_argument("--nnodes", type=int, default=None, help="nodes the ranks are spread over (default: 1)")
    p.add_argument("--master-addr", default=None, help="node 0's address for the rendezvous (default: 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=None,
                   help="rendezvous port on node 0 (default: a free one; required with --nnodes > 1)")
    p.add_argument("--speculative-config", type=json.loads, default=None,
                   help="vLLM's JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 3}' (default: off)")
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None,
                   help="largest step, in tokens, replayed from a CUDA graph; larger steps run eagerly (default: 1024)")
    p.add_argument("--kv-cache-dtype", default=None, choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
                   help="KV cache entries: the model's dtype or fp8 (docs/fp8_kv_cache.md; default: auto)")
    p.add_argument("--strict", action="store_true", help="turn every plan downgrade and plugin fault into an error")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO (the chosen defaults)")


def _engine_options(a: argparse.Namespace) -> dict:
    opts = {name: getattr(a, name) for name in _ENGINE_FLAGS if getattr(a, name, None) is not None}
    if a.strict:
        opts["strict"] = True
    if a.enable_expert_parallel:
        opts["enable_expert_parallel"] = True
    return opts


def cmd_generate(a: argparse.Namespace) -> int:
    from core_runner import LLM

    model = a.model
    if model is None:
        from core_runner.demo import demo_checkpoint

        model = demo_checkpoint()
        print(f"# no --model given: using the built-in demo checkpoint {model} (a tiny trained model)", file=sys.stderr)
    llm = LLM(model, **_engine_options(a))
    given = {k: getattr(a, k) for k in ("max_tokens", "temperature", "top_k", "top_p", "seed")
             if getattr(a, k) is not None}
    # the model's defaults with the given flags on top; replace() validates the result
    params = dataclasses.replace(llm.get_default_sampling_params(), ignore_eos=a.ignore_eos, **given)
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

    llm = LLM(a.model, **_engine_options(a))
    params = PoolingParams(pooling_type=a.pooling_type, normalize=not a.no_normalize,
                           truncate_prompt_tokens=a.truncate)
    outs = llm.embed(a.prompts, params)
    vecs = torch.stack([o.outputs.data for o in outs])
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
        e = out.outputs.data
        if a.json:
            print(json.dumps({"prompt": prompt, "embedding": e.tolist(), "num_tokens": len(out.prompt_token_ids)}))
            continue
        head = ", ".join(f"{v:.4f}" for v in e[: a.show].tolist())
        more = ", ..." if e.numel() > a.show else ""
        print(f"{prompt!r} -> [{head}{more}] (dim {e.numel()}, norm {float(e.norm()):.4f}, "
              f"{len(out.prompt_token_ids)} tokens)")
    return 0


def _headless(a: argparse.Namespace) -> int:
    """A node other than 0: start this node's tensor-parallel ranks and wait for them (the
    model, its options and every step come from node 0's engine)."""
    from core_runner.config import resolve_device
    from core_runner.executor.multiproc import run_headless_node

    tp, nnodes = a.tensor_parallel_size or 1, a.nnodes or 1
    if not a.headless or not 0 < a.node_rank < nnodes or tp % nnodes or a.master_port is None:
        raise ValueError(
            f"--headless / --node-rank {a.node_rank} run a node other than 0: give --headless, --node-rank in "
            f"1..nnodes-1 (nnodes={nnodes}), --tensor-parallel-size divisible by --nnodes (got {tp}) and "
            "node 0's --master-addr and --master-port"
        )
    device = resolve_device(a.device or "auto")
    return run_headless_node(tp, nnodes, a.node_rank, a.master_addr or "127.0.0.1", a.master_port, device)


def cmd_serve(a: argparse.Namespace) -> int:
    from core_runner import LLM
    from core_runner.engine.mp_client import multiprocessing_enabled
    from core_runner.entrypoints.openai.api_server import serve, serve_mp
    from core_runner.entrypoints.openai.tools import ChatOptions

    if a.model_arg is not None and a.model is not None and a.model_arg != a.model:
        raise ValueError(f"two models given: {a.model_arg!r} and --model {a.model!r}; give one")
    if a.headless or a.node_rank:
        return _headless(a)
    if not a.shutdown_timeout >= 0:  # before the model loads
        raise ValueError(f"--shutdown-timeout {a.shutdown_timeout} is invalid: expected seconds >= 0 (0 aborts the "
                         "requests in flight at once)")
    model, name = a.model_arg or a.model, a.served_model_name
    if model is None:
        from core_runner.demo import demo_checkpoint

        model, name = demo_checkpoint(), name or DEMO_SERVED_NAME
        print(f"# no model given: serving the built-in demo checkpoint {model} (a tiny trained model) as "
              f"{name!r}", file=sys.stderr)
    if a.api_server_count != 1:
        raise ValueError(f"--api-server-count {a.api_server_count} is not supported: one API process serves the "
                         "port (several would need per-process output routing in the engine core and merged "
                         "/metrics; docs/engine_core_process.md); pass 1")
    split = multiprocessing_enabled()
    chat_options = ChatOptions(a.tool_call_parser, a.enable_auto_tool_choice, a.reasoning_parser)  # before loading
    app_options = dict(host=a.host, port=a.port, api_key=a.api_key, served_model_name=name,
                       max_body_bytes=a.max_body_bytes, request_timeout=a.request_timeout,
                       shutdown_timeout=a.shutdown_timeout, disable_fastapi_docs=a.disable_fastapi_docs,
                       protect_metrics=a.protect_metrics, chat_options=chat_options)
    if split:  # the engine core in its own process (CORE_RUNNER_ENABLE_MULTIPROCESSING=0: in this one)
        serve_mp(model, _engine_options(a), **app_options)
    else:
        serve(LLM(model, **_engine_options(a)).engine, **app_options)
    return 0


def cmd_plugins(a: argparse.Namespace) -> int:
    from core_runner.plugins import load_plugins
    from core_runner.sdk_version import SDK_VERSION

    pm = load_plugins()
    rows = []
    for name, info in sorted(pm.plugins.items()):
        for reg in pm.registry.by_plugin(name):
            caps = {k: (c.state if not c.reason else f"{c.state}: {c.reason}") for k, c in reg.capabilities.items()}
            rows.append({"plugin": name, "version": info["version"], "architecture": reg.architecture,
                         "tasks": list(reg.tasks), "reference": reg.reference, "sdk_version": reg.sdk_version,
                         "capabilities": caps})
    failed = [{"plugin": name, "error": err} for name, err in sorted(pm.failures.items())]
    if a.json:
        print(json.dumps(rows + [dict(f, architecture=None, failed=True) for f in failed], indent=2))
        return 1 if failed else 0
    if not rows and not failed:
        print("no core-runner plugins installed (entry-point group 'core_runner')")
    print(f"# core_runner.sdk {SDK_VERSION}: each plugin's sdk= range must accept it")
    for r in rows:
        print(f"{r['plugin']} {r['version']}: {r['architecture']} tasks={','.join(r['tasks'])} "
              f"reference={r['reference']} sdk={r['sdk_version'] or 'undeclared'}")
        for k, v in sorted(r["capabilities"].items()):
            print(f"    {k:<18} {v}")
    for f in failed:
        print(f"{f['plugin']}: FAILED TO LOAD: {f['error']}")
    return 1 if failed else 0


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
    parser = argparse.ArgumentParser(prog="core-runner", description=__doc__, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"core-runner {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, formatter_class=_Formatter, **kw)

    g = add("generate", help="generate text for prompts")
    _add_engine_args(g)
    g.add_argument("prompts", nargs="*", help="prompts (default: one demo prompt)")
    model_default = "(default: the checkpoint's generation_config.json, else vLLM's {})"
    g.add_argument("--max-tokens", type=int, default=None, help=model_default.format(16))
    g.add_argument("--temperature", type=float, default=None, help=model_default.format("1.0; 0 is greedy"))
    g.add_argument("--top-k", type=int, default=None, help=model_default.format("-1, off"))
    g.add_argument("--top-p", type=float, default=None, help=model_default.format("1.0, off"))
    g.add_argument("--seed", type=int, default=None, help="(default: drawn from the engine seed)")
    g.add_argument("--ignore-eos", action="store_true", help="generate past EOS")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt")
    g.set_defaults(func=cmd_generate)
    e = add("embed", help="embed texts with an embedding model (vectors or a similarity matrix)")
    _add_engine_args(e)
    e.add_argument("prompts", nargs="+", help="texts to embed")
    e.add_argument("--pooling-type", default=None, choices=["mean", "cls", "last"],
                   help="default: the checkpoint's sentence-transformers pooling, else the model's")
    e.add_argument("--no-normalize", action="store_true", help="print raw (not L2-normalised) vectors")
    e.add_argument("--truncate", type=int, default=None, help="truncate each text to N tokens (-1: the limit)")
    e.add_argument("--similarity", action="store_true", help="print the cosine similarity matrix instead")
    e.add_argument("--show", type=int, default=8, help="vector entries to print (default 8)")
    e.add_argument("--json", action="store_true", help="one JSON object per prompt (or one for --similarity)")
    e.set_defaults(func=cmd_embed)
    s = add("serve", help="serve the model over an OpenAI-compatible HTTP API")
    _add_engine_args(s)
    s.add_argument("model_arg", nargs="?", default=None, metavar="MODEL",
                   help="checkpoint (same as --model; default: the built-in demo)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes and the API docs (/health stays open)")
    s.add_argument("--served-model-name", default=None,
                   help="the model's name in the API and /metrics (default: a local checkpoint's directory name, "
                        "a hub id as given)")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get HTTP 413")
    s.add_argument("--api-server-count", type=int, default=1,
                   help="API processes sharing the port (only 1 is supported: values other than 1 are refused)")
    s.add_argument("--headless", action="store_true",
                   help="run only this node's tensor-parallel ranks for node 0's engine (with --node-rank > 0)")
    s.add_argument("--node-rank", type=int, default=0, help="this node's index (0 runs the engine and the server)")
    s.add_argument("--request-timeout", type=float, default=None,
                   help="abort a request running longer than this many seconds (default: no limit)")
    s.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="on SIGTERM/SIGINT, seconds the requests in flight get before they are aborted (0: abort at "
                        "once; new requests are refused meanwhile; a second signal exits at once)")
    s.add_argument("--disable-fastapi-docs", action="store_true", help="serve no /docs, /redoc, /openapi.json")
    s.add_argument("--protect-metrics", action="store_true",
                   help="/metrics needs the --api-key too (default: open to scrapers, as /health)")
    s.add_argument("--tool-call-parser", default=None,
                   help="how tool calls are read from the output for tool_choice auto: hermes (Qwen3, Hermes "
                        "<tool_call>) or llama3_json (or a core_runner.tool_parsers entry point)")
    s.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="allow tool_choice auto (the default when a request has tools); needs --tool-call-parser")
    s.add_argument("--reasoning-parser", default=None,
                   help="fill reasoning_content from <think>...</think>: qwen3 or deepseek_r1")
    s.set_defaults(func=cmd_serve)
    b = add("bench", help="run workloads W1/W2 (DESIGN.md section 8), W2R (repeated prompts), W3 (shared prefixes)")
    b.add_argument("--model", default=None, help="checkpoint (default: random Qwen3-0.6B-shaped bf16)")
    b.add_argument("--workload", nargs="+", default=["W1", "W2"], choices=["W1", "W2", "W2R", "W3"],
                   help="W2R: W2 with each prompt a short random segment repeated, for n-gram speculation; "
                        "W3: 8 system prompts of 1,000 tokens shared by 512 requests (core_runner/bench/workloads.py)")
    b.add_argument("--prefix-caching", nargs="+", default=None, choices=["on", "off"],
                   help="run each workload with the prefix cache on and/or off; both compare prompt tokens "
                        "computed, tok/s and outputs (default: one run, the engine's default)")
    b.add_argument("--speculative-config", nargs="+", default=None, metavar="JSON",
                   help="run each workload once per value: 'off' or vLLM's dict, e.g. "
                        """'{"method": "ngram", "num_speculative_tokens": 3}'; each variant reports TPOT, tok/s, """
                        "acceptance rate and mean accepted length, and one beside 'off' its TPOT ratio to off and "
                        "how many outputs are identical (default: one run, no speculation)")
    b.add_argument("--temperature", type=float, default=None,
                   help="replace every workload's temperature (0: greedy, under which a random-weight model loops "
                        "and n-gram lookup predicts it); the peer keeps the workload's (default: the workload's)")
    b.add_argument("--num-requests", type=int, default=None, help="a prefix of the workload (smoke runs)")
    b.add_argument("--scale", type=int, default=1, help="divide prompt and output lengths (smoke runs)")
    b.add_argument("--device", default="cuda")
    b.add_argument("--dtype", default="bfloat16")
    b.add_argument("--max-model-len", type=int, default=None, help="(default: as LLM() chooses)")
    b.add_argument("--max-num-seqs", type=int, default=None, help="(default: the engine's, or --best-settings)")
    b.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="(default: the engine's, or --best-settings)")
    b.add_argument("--block-size", type=int, default=None, help="(default: the engine's, 16)")
    b.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="(default: the engine's, 0.9, or --best-settings)")
    b.add_argument("--best-settings", action="store_true",
                   help="the settings measured best on an H200 (core_runner/bench/run.py BEST_SETTINGS) instead of "
                        "the engine's defaults; explicit flags still win")
    b.add_argument("--enforce-eager", action="store_true")
    b.add_argument("--max-cudagraph-capture-size", type=int, default=None,
                   help="largest step, in tokens, replayed from a CUDA graph (default: the engine's, 1024)")
    b.add_argument("--kv-cache-dtype", default=None, choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
                   help="fp8: an fp8 KV cache (docs/fp8_kv_cache.md; default: auto)")
    b.add_argument("--tensor-parallel-size", "-tp", type=int, default=None, help="(default: 1)")
    b.add_argument("--load-format", default=None, choices=["auto", "safetensors", "dummy"],
                   help="dummy: random weights, only config.json is read (default: auto)")
    b.add_argument("--shape", default=None, choices=SHAPES,
                   help="with --load-format dummy: a config-only model of this shape (no --model). deepseek-v3-mtp: "
                        "DeepSeek-V3's architecture and per-layer dims (MLA q_lora 1536 / kv_lora 512 / rope 64, "
                        "noaux_tc routing over 8 groups top-4, top-8 experts of 2048, 1 shared, first 3 layers "
                        "dense, 1 MTP layer) shrunk to 12 layers (of 61) and 32 routed experts (of 256), bf16: "
                        "~40 GB with the MTP layer; qwen3-0.6b-fp8: block fp8 weights resident; gemma-3-1b, "
                        "mamba2-780m: published sizes (core_runner/bench/shapes.py)")
    b.add_argument("--enable-expert-parallel", action="store_true")
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
    c = add("conformance", help="run the shared conformance suite against a plugin (docs/conformance.md)")
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
    p = add("plugins", help="list installed plugins, architectures and capabilities, and plugins that failed "
                           "to load (exit status 1 if any did)")
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
    except (ValueError, TypeError, OSError, ImportError, RuntimeError) as e:
        # a bad option, config or checkpoint: one line, no traceback (-v logs it with one)
        logging.getLogger("core_runner.cli").info("the error's traceback:", exc_info=True)
        print(f"core-runner: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
