"""Cross-encoder reranking: query-passage pairs/s through ``LLM.score`` vs transformers'
``AutoModelForSequenceClassification`` on the same device, dtype and pairs (issue 41:
target >= 3x).

Model: cross-encoder/ms-marco-MiniLM-L-6-v2's shape (BertForSequenceClassification, 6
layers of 384, 12 heads, 1,536 intermediate, one label) with transformers' random init,
saved in --dtype (default float16), and the conformance suite's synthetic byte-level
tokenizer of its 30,522-token vocabulary with BERT's pair template ([CLS] q [SEP] p [SEP],
token types 0 then 1; ``core_runner.conformance.tokenizer``): nothing to download or carry.
Pairs: NUM_PAIRS (2,048) of a short query (a demo-corpus line) and a passage (up to 60
words of consecutive lines), both sides starting from text (tokenization inside the clock).

Engine: ``LLM.score(queries, passages)`` (pairwise), ``max_num_seqs`` = the batch (256).
Peer: what sentence-transformers' CrossEncoder.predict does, without the package: sort
by length, tokenize batches of 256 pairs with padding, forward, sigmoid of the logit.
The report has both pairs/s, the ratio and the largest |score difference|.

    python3 benchmarks/rerank_bench.py [--num-pairs 2048] [--dtype float16] [--json OUT]
    python3 benchmarks/rerank_bench.py --device cpu --dtype float32 --tiny --num-pairs 32   # smoke
"""
from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import torch

from core_runner.bench.variants import write_json

MS_MARCO_MINILM_L6 = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                          intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, num_labels=1,
                          hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)
TINY = dict(vocab_size=1024, hidden_size=48, num_hidden_layers=2, intermediate_size=192)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def write_checkpoint(path: Path, dtype: str, tiny: bool) -> str:
    from transformers import BertConfig, BertForSequenceClassification

    from core_runner.conformance.tokenizer import write_tokenizer

    config = BertConfig(**{**MS_MARCO_MINILM_L6, **(TINY if tiny else {})})
    config.architectures = ["BertForSequenceClassification"]
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).to(DTYPES[dtype]).eval()
    model.save_pretrained(str(path))
    write_tokenizer(path, config)
    return str(path)


def make_pairs(n: int) -> tuple[list[str], list[str]]:
    from core_runner.bench.embed_bench import bench_sentences

    lines = bench_sentences(max(64, n + 4))
    queries = [lines[i] for i in range(n)]
    passages = [" ".join(" ".join(lines[i + 1: i + 4]).split()[:60]) for i in range(n)]
    return queries, passages


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_engine(model: str, queries, passages, device: str, dtype: str, batch: int,
               tokens: int | None = None, profile: bool = False) -> tuple[dict, torch.Tensor]:
    """``tokens`` None: the engine's own max_num_batched_tokens (reported as used)."""
    from core_runner import LLM
    from core_runner.bench.profile import profile_call

    llm = LLM(model, device=device, dtype=dtype, max_model_len=512, max_num_seqs=batch,
              max_num_batched_tokens=tokens)
    # warm-up: the whole call once, so that every Triton specialisation its step shapes need
    # is compiled before the clock (a warm-up on one batch left compiles inside the timed
    # call: the first engine of a run measured 2,536 pairs/s where a second, warm one of the
    # same budget measured ~4,000 on the H100)
    llm.score(queries, passages, use_tqdm=False)
    sync(device)
    t0 = time.perf_counter()
    outs = llm.score(queries, passages, use_tqdm=False)
    sync(device)
    elapsed = time.perf_counter() - t0
    scores = torch.tensor([o.outputs.score for o in outs])
    n = sum(len(o.prompt_token_ids) for o in outs)
    res = {"pairs_per_s": len(queries) / elapsed, "tokens_per_s": n / elapsed, "seconds": elapsed,
           "mean_pair_tokens": n / len(outs), "max_num_batched_tokens": llm.engine.config.max_num_batched_tokens,
           "engine_default_tokens": tokens is None, "plan": repr(llm.engine.plan)}
    if profile:
        # the timed call again, outside the clock, under the torch profiler and cProfile
        res["profile"] = profile_call(partial(llm.score, queries, passages, use_tqdm=False), llm.engine.debug.on_step)
    llm.engine.shutdown()
    del llm
    return res, scores


def run_transformers(model: str, queries, passages, device: str, dtype: str, batch: int) -> tuple[dict, torch.Tensor]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForSequenceClassification.from_pretrained(model, dtype=DTYPES[dtype]).to(device).eval()

    def predict(qs: list[str], ps: list[str]) -> torch.Tensor:
        order = sorted(range(len(qs)), key=lambda i: -(len(qs[i]) + len(ps[i])))
        out = torch.empty(len(qs))
        for s in range(0, len(order), batch):
            idx = order[s: s + batch]
            enc = tok([qs[i] for i in idx], [ps[i] for i in idx], padding=True, truncation=True, max_length=512,
                      return_tensors="pt").to(device)
            with torch.inference_mode():
                logits = hf(**enc).logits[:, 0].float()
            out[idx] = torch.sigmoid(logits).cpu()
        return out

    predict(queries[:batch], passages[:batch])
    sync(device)
    t0 = time.perf_counter()
    scores = predict(queries, passages)
    sync(device)
    elapsed = time.perf_counter() - t0
    return {"pairs_per_s": len(queries) / elapsed, "seconds": elapsed}, scores


def print_profile(found: dict) -> None:
    from core_runner.bench.profile import host_lines, kernel_lines

    idle, busy = found.get("gpu_idle_frac", float("nan")), found.get("gpu_busy_ms_per_step", 0)
    print(f"  profiled call: {found.get('wall_ms_profiled', 0):.0f} ms wall, {found.get('steps')} steps, GPU idle "
          f"{idle:.0%}, GPU busy {busy:.2f} ms a step", flush=True)
    print("\n".join(kernel_lines(found.get("top_kernels", [])[:10], "") + host_lines(found.get("host_top", [])[:12],
                                                                                    "host")), flush=True)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float16", choices=list(DTYPES))
    ap.add_argument("--num-pairs", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=lambda v: None if v == "default" else int(v), nargs="+",
                    default=[None], help="the engine's token budget per step ('default': the engine's choice); "
                                         "several run one engine each (the first is the reported one, the rest go "
                                         "under 'engine_by_tokens')")
    ap.add_argument("--tiny", action="store_true", help="shrunk sizes (CPU smoke test)")
    ap.add_argument("--model", default=None, help="a cross-encoder checkpoint instead of the random one")
    ap.add_argument("--profile", action="store_true",
                    help="profile one more engine call (torch profiler + cProfile) and print where it went")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import tempfile

    queries, passages = make_pairs(a.num_pairs)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or write_checkpoint(Path(tmp) / "ms-marco-minilm-l6-shape", a.dtype, a.tiny)
        runs = []
        for tokens in a.max_num_batched_tokens:
            runs.append(run_engine(model, queries, passages, a.device, a.dtype, a.batch, tokens,
                                   profile=a.profile and not runs))
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
        eng, eng_scores = runs[0]
        peer, peer_scores = run_transformers(model, queries, passages, a.device, a.dtype, a.batch)
    res = {"model": a.model or "ms-marco-MiniLM-L-6-v2 shape (random weights)", "device": a.device, "dtype": a.dtype,
           "num_pairs": a.num_pairs, "batch": a.batch, "engine": eng, "transformers": peer,
           "ratio": eng["pairs_per_s"] / peer["pairs_per_s"],
           "max_abs_score_diff": float((eng_scores - peer_scores).abs().max()),
           "engine_by_tokens": {str(r["max_num_batched_tokens"]): {"pairs_per_s": r["pairs_per_s"],
                                "ratio": r["pairs_per_s"] / peer["pairs_per_s"],
                                "max_abs_score_diff": float((sc - peer_scores).abs().max()),
                                "engine_default_tokens": r["engine_default_tokens"]} for r, sc in runs}}
    print(f"rerank engine: {eng['pairs_per_s']:,.0f} pairs/s ({eng['tokens_per_s']:,.0f} tok/s, "
          f"{eng['mean_pair_tokens']:.0f} tokens a pair); transformers {peer['pairs_per_s']:,.0f} pairs/s; "
          f"ratio {res['ratio']:.2f}x (target >= 3x); max |score diff| {res['max_abs_score_diff']:.2e} "
          f"({a.num_pairs} pairs, {a.dtype} on {a.device}, {eng['max_num_batched_tokens']} tokens a step"
          f"{', the engine default' if eng['engine_default_tokens'] else ''})", flush=True)
    if "profile" in eng:
        print_profile(eng["profile"])
    for r, _ in runs[1:]:
        print(f"  with {r['max_num_batched_tokens']} tokens a step: {r['pairs_per_s']:,.0f} pairs/s, ratio "
              f"{r['pairs_per_s'] / peer['pairs_per_s']:.2f}x", flush=True)
    return write_json(a.json, res)


if __name__ == "__main__":
    main()
    sys.exit(0)
