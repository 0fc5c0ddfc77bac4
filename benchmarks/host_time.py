"""Host time of the engine without its model: the model's forward is replaced by one that
returns zeros, so what is left is everything the host does around it (tokenization,
validation, scheduling, staged writes, input preparation, pooling or sampling, outputs).

Two cases, on the CPU (no GPU needed; on a GPU the host overlaps the device, and this is the
part that must stay below a step's device time):
- ``score``: ``LLM.score`` of NUM pairs on the ms-marco-MiniLM-L6-shaped cross-encoder of
  ``rerank_bench.py`` (tiny sizes: the forward is gone anyway), 256 rows, 32,768 tokens a
  step: ms per call, with the phases (pair tokenization, request processing, stepping).
- ``decode``: a Gemma-3-like decode step (26 layers in Gemma 3's 5:1 pattern, window 1,024,
  tiny widths), ROWS requests at CONTEXT tokens: host ms per pure-decode step (p50).

    python3 benchmarks/host_time.py score [--num 2048] [--repeat 5]
    python3 benchmarks/host_time.py decode [--rows 128] [--context 4096]
"""
from __future__ import annotations

import argparse
import collections
import functools
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _stub_forward(llm) -> None:
    hidden = int(llm.engine.hf_config.hidden_size)
    llm.engine.debug.model.forward = lambda input_ids, positions, **kw: torch.zeros(input_ids.shape[0], hidden)


def _timed(totals: collections.Counter, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0
    return wrapper


def score_case(num: int, repeat: int) -> dict:
    import rerank_bench as rb

    import core_runner.engine.score as score_mod
    from core_runner import LLM

    queries, passages = rb.make_pairs(num)
    with tempfile.TemporaryDirectory() as tmp:
        model = rb.write_checkpoint(Path(tmp) / "cross-encoder", "float32", tiny=True)
        llm = LLM(model, device="cpu", dtype="float32", max_model_len=512, max_num_seqs=256,
                  max_num_batched_tokens=32768)
        _stub_forward(llm)
        totals: collections.Counter = collections.Counter()
        encode_pairs = score_mod.encode_pairs
        score_mod.encode_pairs = _timed(totals, "tokenize pairs", encode_pairs)
        try:
            llm._process = _timed(totals, "process requests", llm._process)
            llm._run = _timed(totals, "step the engine", llm._run)
            llm.score(queries, passages, use_tqdm=False)  # warm-up
            totals.clear()
            t0 = time.perf_counter()
            for _ in range(repeat):
                llm.score(queries, passages, use_tqdm=False)
            per_call = (time.perf_counter() - t0) / repeat
        finally:
            score_mod.encode_pairs = encode_pairs
    return {"case": "score", "pairs": num, "ms_per_call": 1e3 * per_call, "us_per_pair": 1e6 * per_call / num,
            "phases_ms": {k: 1e3 * v / repeat for k, v in totals.most_common()}}


def decode_case(rows: int, context: int, output_len: int = 64) -> dict:
    import gemma3_bench as gb

    from core_runner import SamplingParams
    from core_runner.bench.shapes import config_only_checkpoint
    from core_runner.bench.variants import build_llm, variant_args
    from core_runner.executor.gc_heap import paused_gc

    with tempfile.TemporaryDirectory() as tmp:
        model = config_only_checkpoint("gemma-3-1b", tmp, **{**gb.TINY, "num_hidden_layers": 26,
                                                             "sliding_window": 1024})
        llm = build_llm(model, variant_args(device="cpu", dtype="float32", max_model_len=context, max_num_seqs=rows,
                                            num_kv_blocks=(context // 16 + 2) * rows))
        _stub_forward(llm)
        eng = llm.engine
        rng = random.Random(0)
        for i in range(rows):
            prompt = [rng.randrange(3, eng.vocab_size) for _ in range(context - output_len)]
            eng.add_request(prompt, SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True),
                            req_id=f"d{i}")
        walls = []
        with paused_gc():
            while eng.has_unfinished_requests():
                t0 = time.perf_counter()
                eng.step()
                walls.append(time.perf_counter() - t0)
    decode = sorted(walls[-(output_len - 8):])  # the last steps: every row decodes
    return {"case": "decode", "rows": rows, "context": context, "steps": len(walls),
            "decode_step_host_ms_p50": 1e3 * decode[len(decode) // 2]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=["score", "decode"])
    ap.add_argument("--num", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--context", type=int, default=4096)
    a = ap.parse_args(argv)
    res = score_case(a.num, a.repeat) if a.case == "score" else decode_case(a.rows, a.context)
    print(res, flush=True)
    return res


if __name__ == "__main__":
    main()
