"""fp8 weights and fp8 KV cache on the Qwen3-0.6B shape, against bf16, in one call (issue 41).

Three engines on random (dummy) weights, each built once and given its workloads:

* ``bf16``: the ``qwen3-0.6b`` shape, bf16 weights and KV: W1, W2;
* ``fp8w``: the ``qwen3-0.6b-fp8`` shape (Qwen3-0.6B-FP8's quantization_config: block fp8
  [128, 128]): q/k/v, o, gate/up and down held as float8_e4m3fn with block scales (dummy
  loading quantizes random values per block), the W8A8 Triton kernel: W1, W2;
* ``fp8kv``: the bf16 shape with ``kv_cache_dtype="fp8"``: W1 (issue target: >= 1.3x bf16).

Prints one line per run and the ratios; the JSON holds every run_engine result, the
roofline, which layers are fp8 resident (``fp8_resident``) and the ratios (``ratios``).

    python3 benchmarks/fp8w_bench.py [--num-requests N] [--json OUT]
    python3 benchmarks/fp8w_bench.py --device cpu --dtype float32 --tiny --num-requests 4 --scale 32   # smoke
"""
from __future__ import annotations

import sys

from core_runner.bench.variants import workload_parser, write_json

# small enough for a CPU smoke run: every feature of the shapes kept, blocks of 16
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)


def main(argv: list[str] | None = None) -> dict:
    ap = workload_parser(__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", default=["bf16", "fp8w", "fp8kv"], choices=["bf16", "fp8w", "fp8kv"])
    a = ap.parse_args(argv)
    from core_runner.bench.shapes import QWEN3_FP8_QUANTIZATION, config_only_checkpoint
    from core_runner.bench.variants import ratio, run_variant, summary_line, variant_args

    over = dict(TINY) if a.tiny else {}
    fp8_over = dict(over)
    if a.tiny:
        fp8_over["quantization_config"] = {**QWEN3_FP8_QUANTIZATION, "weight_block_size": [16, 16]}
    dense = config_only_checkpoint("qwen3-0.6b", a.root, **over)
    fp8 = config_only_checkpoint("qwen3-0.6b-fp8", a.root, **fp8_over)
    args = variant_args(device=a.device, dtype=a.dtype, num_requests=a.num_requests, scale=a.scale)
    plan = {"bf16": (dense, ["W1", "W2"], {}), "fp8w": (fp8, ["W1", "W2"], {}),
            "fp8kv": (dense, ["W1"], {"kv_cache_dtype": "fp8"})}
    res: dict = {}
    for part in a.parts:
        model, workloads, kw = plan[part]
        res[part] = run_variant(model, workloads, args, **kw)
        for w in workloads:
            print(summary_line(f"{part} {w}", res[part][w]), flush=True)
    if "fp8w" in res:
        fp8_info = res["fp8w"]["_engine"]["fp8"]
        res["fp8_resident"] = fp8_info
        print(f"fp8 resident: {sum(fp8_info['fp8_modules'].values())} modules {sorted(fp8_info['fp8_modules'])}; "
              f"{fp8_info['fp8_weight_bytes'] / 2**20:.0f} MiB fp8 + {fp8_info['fp8_scale_bytes'] / 2**20:.2f} MiB "
              f"scales, {fp8_info['other_weight_bytes'] / 2**20:.0f} MiB other weights; dense fp8-capable: "
              f"{sorted(fp8_info['dense_fp8_capable_modules'])}")
    ratios = {}
    base = res.get("bf16", {})
    for part, workloads in (("fp8w", ["W1", "W2"]), ("fp8kv", ["W1"])):
        for w in workloads if part in res and base else ():
            r = ratios[f"{part}_{w}"] = {"tok_s": ratio(res[part][w], base[w], "output_tok_s"),
                                         "tpot_p50": ratio(res[part][w], base[w], "tpot_p50_ms")}
            target = " (target >= 1.3x)" if part == "fp8kv" else ""
            print(f"{part} / bf16 {w}: {r['tok_s']:.2f}x tok/s{target}, TPOT p50 {r['tpot_p50']:.2f}x", flush=True)
    res["ratios"] = ratios
    return write_json(a.json, res)


if __name__ == "__main__":
    main()
    sys.exit(0)
