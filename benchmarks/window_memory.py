"""KV blocks a model with local (sliding-window) and global layers holds for one long request.

Builds a narrow random checkpoint with a layer pattern (default: Gemma 3's, five local
layers to one global, 26 layers, window 1,024), runs one request of CONTEXT tokens
through the engine on the CPU, and reports the peak blocks of each KV cache group
(``engine.debug.blocks_held``) as tokens of KV held per layer, against
local_layers x window + global_layers x context and all_layers x context. The peak
falls in a prefill step, which writes its whole chunk (the step budget) into every layer;
the decode figure is the steady state.

    python benchmarks/window_memory.py [--arch qwen3|gemma3] [--context 8192] [--window 1024] [--json OUT]

The width is cut (hidden 64) since only the block counts are measured; the architecture
is Qwen3 with explicit ``layer_types`` (or Gemma 3 when its plugin is installed).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def _checkpoint(root: Path, arch: str, layers: int, window: int, context: int) -> tuple[str, list[str]]:
    import transformers

    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=context + 64,
                  sliding_window=window, layer_types=types)
    if arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(**common)
        model = transformers.Gemma3ForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3Config(use_sliding_window=True, max_window_layers=0, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    path = root / arch
    model.save_pretrained(str(path))
    return str(path), types


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3", choices=["qwen3", "gemma3"])
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from core_runner import LLM, SamplingParams

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path, types = _checkpoint(Path(tmp), a.arch, a.layers, a.window, a.context)
        llm = LLM(path, device="cpu", dtype="float32", max_model_len=a.context + 16, max_num_seqs=1,
                  block_size=a.block_size, max_num_batched_tokens=a.budget)
        eng = llm.engine
        prompt = torch.randint(3, 256, (a.context - 8,), generator=torch.Generator().manual_seed(1)).tolist()
        eng.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), req_id="long")
        groups = eng.debug.kv_cache_groups()
        peak = [0] * len(groups)
        decode = peak
        t0 = time.perf_counter()
        while eng.has_unfinished_requests():
            eng.step()
            if "long" in eng.scheduler.requests:
                decode = eng.debug.blocks_held("long")  # the last one is a decode step's
                peak = [max(p, h) for p, h in zip(peak, decode)]
        seconds = time.perf_counter() - t0
    n_local = sum(t == "sliding_attention" for t in types)
    n_global = len(types) - n_local
    held_tokens = sum(p * a.block_size * len(g["layers"]) for p, g in zip(peak, groups))
    rep = {
        "arch": a.arch, "layers": a.layers, "local_layers": n_local, "global_layers": n_global,
        "window": a.window, "context": a.context, "block_size": a.block_size, "step_budget": a.budget,
        "kv_cache_groups": [{"sliding_window": g["sliding_window"], "layers": len(g["layers"]), "peak_blocks": p,
                             "decode_blocks": d} for g, p, d in zip(groups, peak, decode)],
        "kv_tokens_held_all_layers": held_tokens,
        "kv_tokens_held_at_decode": sum(d * a.block_size * len(g["layers"]) for d, g in zip(decode, groups)),
        "predicted_local_x_window_plus_global_x_context": n_local * a.window + n_global * a.context,
        "predicted_peak_local_x_window_plus_step": n_local * (a.window + a.budget) + n_global * a.context,
        "all_layers_x_context": a.layers * a.context,
        "pool_block_ids": eng.num_blocks, "seconds": round(seconds, 1),
    }
    rep["ratio_to_all_layers"] = round(held_tokens / rep["all_layers_x_context"], 3)
    rep["peak_ratio_to_predicted_peak"] = round(held_tokens / rep["predicted_peak_local_x_window_plus_step"], 3)
    rep["decode_ratio_to_predicted"] = round(rep["kv_tokens_held_at_decode"]
                                             / rep["predicted_local_x_window_plus_global_x_context"], 3)
    print(json.dumps(rep, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()
