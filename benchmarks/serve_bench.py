"""W2 through ``core-runner serve``: 256 concurrent streaming clients against the offline run.

Starts the server in a subprocess on 127.0.0.1 (the bench's random Qwen3-0.6B-shaped
checkpoint unless --model), sends every W2 request at once as its own streaming
/v1/completions call (token-id prompt, W2's max_tokens, temperature 0.6, ignore_eos,
stream_options.include_usage) over plain asyncio HTTP/1.1 (no client library needed),
and reports completion tokens / wall time; then runs the same workload offline with
``LLM.generate`` in this process and prints the ratio (issue 27: >= 0.8x).

    python3 benchmarks/serve_bench.py [--model PATH] [--num-requests N] [--json OUT]
        [--engine split|in-process|both] [--device cpu]

``--engine``: the server's engine core in its own process (``split``, what ``core-runner
serve`` does by default) or in the server's process (``in-process``:
CORE_RUNNER_ENABLE_MULTIPROCESSING=0); ``both`` serves the workload once each and prints
both figures (a CPU comparison: ``--model <demo checkpoint> --device cpu --scale 8``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request


async def one(port: int, body: dict) -> tuple[int, float, float, float, int]:
    """(completion tokens, seconds to the first streamed chunk, seconds in all, seconds to the
    status line (the request was queued: the server answers once it has started it), events)
    of one request."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data)
    await writer.drain()
    first, tokens, head, events = None, 0, None, 0
    while True:
        line = await reader.readline()
        if not line:
            break
        if head is None:
            head = time.perf_counter() - t0
        if line.startswith(b"data: {"):
            events += 1
            if first is None:
                first = time.perf_counter() - t0
            if b'"usage"' in line:  # only the last event carries it: the others are not parsed, so the
                event = json.loads(line[6:])  # client keeps up with ~20k events/s on one core
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    writer.close()
    return tokens, first or float("nan"), time.perf_counter() - t0, head or float("nan"), events


async def clients(port: int, model: str, workload) -> tuple[int, float, list]:
    bodies = [{"model": model, "prompt": p, "max_tokens": n, "temperature": t, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}} for p, n, t in workload]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(port, b) for b in bodies))
    return sum(r[0] for r in results), time.perf_counter() - t0, results


def run(coro):
    """The clients on uvloop when it is installed (the client must not be what falls behind)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError("the server did not come up")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--scale", type=int, default=1, help="divide W2's lengths (smoke runs)")
    ap.add_argument("--port", type=int, default=8471)
    ap.add_argument("--json", default=None)
    ap.add_argument("--engine", default="split", choices=["split", "in-process", "both"],
                    help="the server's engine core in its own process, in the server's, or each in turn")
    ap.add_argument("--device", default=None, help="passed to serve and the offline LLM (default: theirs)")
    ap.add_argument("--profile-api", default=None, help="cProfile the server's process into PATH.<engine>")
    a = ap.parse_args()
    from core_runner.bench.run import default_checkpoint
    from core_runner.bench.workloads import make_workload

    model = a.model or default_checkpoint("cuda")
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    workload = make_workload("W2", vocab_size=vocab, num_requests=a.num_requests, scale=a.scale)
    engines = ["split", "in-process"] if a.engine == "both" else [a.engine]
    report = {}
    for engine in engines:
        try:
            served, tokens, wall, ttft = serve_once(a, model, engine, workload)
        except (RuntimeError, TimeoutError) as e:
            if len(engines) == 1:
                raise
            print(f"serve ({engine}): failed: {e}")  # e.g. no pyzmq / msgspec for the split: the other still runs
            continue
        print(f"serve ({engine}): {len(workload)} streaming clients, {tokens:,} tokens in {wall:.1f} s = "
              f"{served:,.0f} tok/s; TTFT p50 {ttft:.2f} s")
        report[engine] = {"served_tok_s": served, "tokens": tokens, "wall_s": wall, "ttft_p50_s": ttft}
    from core_runner import LLM, SamplingParams

    llm = LLM(model, **({"device": a.device} if a.device else {}))
    params = [SamplingParams(max_tokens=n, temperature=t, ignore_eos=True) for _, n, t in workload]
    prompts = [{"prompt_token_ids": p} for p, _, _ in workload]
    llm.generate(prompts[:8], params[:8], use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    offline_wall = time.perf_counter() - t0
    offline = sum(len(o.outputs[0].token_ids) for o in outs) / offline_wall
    firsts = sorted(o.first_token_time - t0 for o in outs)
    offline_ttft = firsts[len(firsts) // 2]
    for engine, r in report.items():
        r["ttft_ratio"] = r["ttft_p50_s"] / offline_ttft
        print(f"offline: {offline:,.0f} tok/s, TTFT p50 {offline_ttft:.3f} s; serve ({engine}) / offline = "
              f"{r['served_tok_s'] / offline:.2f}x tok/s (target >= 0.95x), TTFT p50 {r['ttft_ratio']:.2f}x "
              "(target <= 2x)")
    if a.json and report:
        engine = next(iter(report))
        first = report[engine]
        with open(a.json, "w") as f:
            json.dump({**first, "engine": engine, "offline_tok_s": offline, "offline_ttft_p50_s": offline_ttft,
                       "ratio": first["served_tok_s"] / offline, "num_requests": len(workload),
                       "engines": report}, f, indent=2)
    return 0


def serve_once(a: argparse.Namespace, model: str, engine: str, workload) -> tuple[float, int, float, float]:
    """(tok/s, tokens, wall s, TTFT p50 s) of the workload against ``core-runner serve`` in a subprocess."""
    cmd = [sys.executable, "-m", "core_runner.cli", "serve", model, "--port", str(a.port)]
    if a.device:
        cmd += ["--device", a.device]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CORE_RUNNER_ENABLE_MULTIPROCESSING": "0" if engine == "in-process"
           else "1"}
    if a.profile_api:  # the API process's main thread (the event loop) under cProfile, written at exit
        cmd[1:1] = ["-m", "cProfile", "-o", f"{a.profile_api}.{engine}"]
    proc = subprocess.Popen(cmd, env=env)
    try:
        wait_ready(a.port, proc)
        run(clients(a.port, model, workload[:8]))  # warm-up: graphs and kernels compiled already
        cpu0, ttft0 = _cpu_seconds(proc.pid), _api_ttft(a.port)
        tokens, wall, results = run(clients(a.port, model, workload))
        cpu, ttft1 = _cpu_seconds(proc.pid) - cpu0, _api_ttft(a.port)
    finally:
        proc.terminate()
        proc.wait(60)
    ttft = sorted(r[1] for r in results)
    heads = sorted(r[3] for r in results)
    q = [len(ttft) // 10, len(ttft) // 2, len(ttft) * 9 // 10]
    print(f"  serve ({engine}) client view: status line p10/p50/p90 {' / '.join(f'{heads[i]:.2f}' for i in q)} s, "
          f"first chunk {' / '.join(f'{ttft[i]:.2f}' for i in q)} s, {sum(r[4] for r in results):,} events for "
          f"{tokens:,} tokens; API process CPU {cpu:.1f} s in {wall:.1f} s", flush=True)
    if ttft0 is not None and ttft1 is not None and ttft1[1] > ttft0[1]:
        # the API process's own TTFT (from its start of a request to the event loop taking the first
        # token from the core): small here with a late first chunk means the delay is in delivery
        n = ttft1[1] - ttft0[1]
        below = {le: c1 - ttft0[2].get(le, 0) for le, c1 in ttft1[2].items()}
        p50 = min((le for le, c in below.items() if c >= n / 2), default=float("inf"))
        print(f"  serve ({engine}) API-side TTFT (vllm:time_to_first_token_seconds over {n:.0f} requests): mean "
              f"{(ttft1[0] - ttft0[0]) / n:.2f} s, p50 <= {p50:g} s", flush=True)
    return tokens / wall, tokens, wall, ttft[len(ttft) // 2]


def _api_ttft(port: int) -> tuple[float, float, dict[float, float]] | None:
    """(sum, count, {bucket upper bound: count}) of the server's TTFT histogram, or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return parse_ttft(r.read().decode())
    except OSError:
        return None


def parse_ttft(text: str) -> tuple[float, float, dict[float, float]]:
    """(sum, count, {le: cumulative count}) of ``vllm:time_to_first_token_seconds`` in a
    Prometheus text exposition, summed over its label sets."""
    total, count, buckets = 0.0, 0.0, {}
    for line in text.splitlines():
        if not line.startswith("vllm:time_to_first_token_seconds"):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("vllm:time_to_first_token_seconds_sum"):
            total += float(value)
        elif name.startswith("vllm:time_to_first_token_seconds_count"):
            count += float(value)
        elif "_bucket" in name and 'le="' in name:
            le = float(name.split('le="', 1)[1].split('"', 1)[0])
            buckets[le] = buckets.get(le, 0.0) + float(value)
    return total, count, buckets


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the server's own process (not the engine core's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
