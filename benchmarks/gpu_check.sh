#!/usr/bin/env bash
# Run the GPU checks and benchmarks in one go; logs and JSON results go to LOGDIR.
#   benchmarks/gpu_check.sh LOGDIR [STAGE ...] [--quick] [--peer W1 W2] [--family-peer]
# Stages (default: all, in this order):
#   tests     the union of tests-kernels and tests-gpu (each with its own limit)
#   tests-kernels  tests/kernels on the GPU, pytest-xdist -n TEST_WORKERS (4) when installed, 240 s  -> tests_kernels.log
#   tests-gpu every gpu-marked test file (tests/test_*.py), -n TEST_WORKERS_GPU (2), 240 s       -> tests_gpu.log (TEST_TIMEOUT (env) sets both limits)
#             (GPU_TESTS (env) narrows either to the paths / node ids given; the tests use fixed small KV
#             pools and no fixed ports or files, so workers only share the GPU and Triton's cache; the bench
#             stages' own GPU tests, tests/test_bench_*.py, run only when GPU_TESTS names them)
#   sampler   core-runner bench --sampler                               -> sampler.json
#   qwen      core-runner bench W1 W2 (Qwen3-0.6B shape, --peer ...)    -> qwen.json
#   granite   granite-4.0-h-350m shape, W1 (+ peer with --family-peer; GRANITE_PROFILE=N: --profile-steps N) -> granite.json
#   deepseek  DeepSeek-V2-Lite (published config, random bf16), W1 W2 (+ peer with --family-peer) -> deepseek.json
#             (DS_WORKLOADS narrows, DS_PROFILE=N adds --profile-steps N)
#   deepseek-w2peer  the same model, W2 on its first W2_PEER_N (4) requests, next to the
#             transformers peer (bounded by PEER_TIMEOUT)             -> deepseek_w2peer.json
#   moe-sweep fused MoE tile sweep, DeepSeek-V2-Lite layer (T 256 / 1024 / 8192), then V3's; the best
#             two tiles also with silu x up in the first GEMM's epilogue (--fuse-activation)
#             (MOE_SHAPES (env): which of v2-lite v3)                     -> moe_sweep_<shape>.json
#   moe-align the fused MoE's pair alignment, torch moe_align vs moe_align_triton (the CUDA default since
#             session 23), T 1..8192 at V2-Lite / V3 routing, decode sizes from CUDA graphs  -> moe_align.json
#   fp8-moe   fp8 grouped GEMM GPU tests, then fp8 vs bf16 fused MoE at the DeepSeek-V3 layer (T 1..256 from
#             CUDA graphs, 4096 / 8192 eager; FP8_MOE_TOKENS (env) narrows)  -> fp8_moe.json
#   conformance  the suite's GPU checks (graph = eager, Triton = torch) for every plugin
#   embed     all-MiniLM-L6-v2 sentences/s vs transformers (weights in .minilm16, carried)
#   embedprof the embed stage under cProfile (host time of 2,048 sentences; printed only)
#   w3        core-runner bench W3 (shared prefixes), prefix cache on vs off (Qwen3-0.6B shape) -> w3.json
#   smoke     fp8 kernel tests + quantization mismatches, prefix cache / ngram equality on CUDA
#   biggraphs prefill steps replayed from CUDA graphs: the GPU test, then W1 W2 with
#             --max-cudagraph-capture-size 8192 (compare with qwen)                 -> qwen_graphs8192.json
#   best      W1 W2 with --best-settings (the defaults must reach 90% of these)     -> qwen_best.json
#   serve     W2 through core-runner serve, one streaming client per request, vs offline -> serve.json
#             (installs fastapi/uvicorn from a carried .wheels/ when the image lacks them:
#             pip download --dest .wheels --only-binary=:all: --python-version 3.12 fastapi uvicorn prometheus_client
#             uvloop httptools)
#   attn      paged attention launch choices at W1 / W2 / Gemma-3 decode step shapes (ATTN_SHAPES narrows;
#             ATTN_KV=fp8: an fp8 cache, the bf16 default beside it)            -> attn.json / attn_fp8.json
#   spec      speculative decoding on W2R (W2 with repeated prompts): TPOT, tok/s, acceptance, off vs
#             n-gram k=3 on the Qwen3-0.6B shape at T 0.6 -> spec.json and greedy -> spec_greedy.json;
#             off vs MTP k=1 on the deepseek-v3-mtp shape (random weights, first SPEC_MTP_N (128)
#             requests) -> spec_mtp.json; then tests/test_spec_gpu.py -> spec_tests.log. SPEC_PARTS
#             (env) runs some of the three: ngram, mtp, tests
#   --- issue 41 figures (each ~1-2.5 min on an H200; random / dummy weights, nothing to carry but .wheels for so)
#   fp8w      Qwen3-0.6B shape: bf16 W1 W2, block-fp8 weights resident (qwen3-0.6b-fp8, [128,128]) W1 W2, and
#             --kv-cache-dtype fp8 W1; ratios to bf16 (fp8 KV W1 target >= 1.3x), fp8 layers  -> fp8w.json
#             (FP8W_N (env): --num-requests, FP8W_PARTS: some of bf16 fp8w fp8kv)
#   so        W2 with a JSON schema on every request vs without, one engine (synthetic byte-level tokenizer):
#             TPOT p50 ratio (target <= 1.15x), tok/s, finish reasons, parsed fraction          -> so.json
#             needs xgrammar: installed from a carried .wheels/ when the image lacks it; download with
#             pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#               --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
#               -d .wheels xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.13.4 pydantic_core==2.46.4
#               annotated-types==0.7.0 typing-inspection==0.4.2   (SO_N (env): --num-requests)
#             (with compressed-tensors and loguru too, for the quantization tests: every stage installs
#             compressed-tensors and xgrammar from .wheels at the start when the image lacks them)
#   gemma3    gemma-3-1b shape (dummy), window GEMMA3_WINDOW (1024), 128 requests of 8,192 tokens: KV held vs
#             local x min(ctx, window) + global x ctx, pure-decode tok/s vs roofline               -> gemma3.json
#             (GEMMA3_PROFILE=N: N decode steps under the profilers, top kernels printed)
#   w3granite W3 on the granite-4.0-h-350m checkpoint (written as for granite), prefix cache on vs off  -> w3granite.json
#             (W3G_N (env): --num-requests)
#   rerank    ms-marco-MiniLM-L-6-v2-shaped cross-encoder (random fp16): LLM.score vs transformers pairs/s on
#             2,048 pairs (target >= 3x)                                                      -> rerank.json
#   mamba2    mamba2-780m shape (dummy bf16), W1 vs roofline (weights + state read and written per row and step),
#             prefix cache off, --max-num-seqs MAMBA2_SEQS (512)                                -> mamba2.json
# Everything printed also goes to bench.log; at most 8 files come back from the device.
set -uo pipefail
LOG=${1:?usage: gpu_check.sh LOGDIR [STAGE ...] [--quick] [--peer W1 W2] [--family-peer]}
shift
QUICK=0; PEER=(); FPEER=0; STAGES=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1;;
    --family-peer) FPEER=1;;
    --peer) PEER=(--peer); shift; while [ $# -gt 0 ] && [[ $1 != --* ]]; do PEER+=("$1"); shift; done; continue;;
    *) STAGES+=("$1");;
  esac
  shift
done
[ ${#STAGES[@]} -eq 0 ] && STAGES=(tests sampler qwen granite deepseek embed)
mkdir -p "$LOG"
cd "$(dirname "$0")/.."
ROOT=$PWD
PP=$ROOT
for p in plugins/*/ examples/plugin_template/; do PP=$PP:$ROOT/${p%/}; done
export PYTHONPATH=$PP${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
pipargs=(-e . -e examples/plugin_template); for p in plugins/*/; do pipargs+=(-e "${p%/}"); done
python3 -m pip install -q --no-deps --no-build-isolation "${pipargs[@]}" >"$LOG/env.log" 2>&1 \
  || echo "editable install failed (see env.log); using PYTHONPATH"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  python3 -m core_runner.cli plugins | grep -v '^    '
} >>"$LOG/env.log" 2>&1
tail -6 "$LOG/env.log"
N=(); [ "$QUICK" = 1 ] && N=(--num-requests 64)
# packages the GPU image lacks (compressed-tensors for the quantization tests, xgrammar for the
# grammar tests): installed from a carried .wheels/ (see the so / serve stages for the downloads)
for pkg in compressed_tensors:compressed-tensors xgrammar:xgrammar; do
  python3 -c "import ${pkg%%:*}" 2>/dev/null || [ ! -d .wheels ] || python3 -m pip install -q --no-index \
    --find-links .wheels "${pkg##*:}" >>"$LOG/env.log" 2>&1 || echo "${pkg##*:} not installable from .wheels (env.log)"
done
CKPT=/tmp/cr_ckpt; mkdir -p $CKPT
say() { echo "=== $* ($(date +%T))" | tee -a "$LOG/bench.log"; }
for s in "${STAGES[@]}"; do
  case $s in
    tests|tests-kernels|tests-gpu)
      parts=("$s"); [ "$s" = tests ] && parts=(tests-kernels tests-gpu)
      for part in "${parts[@]}"; do
        say "$part"
        if [ "$part" = tests-kernels ]; then
          paths=${GPU_TESTS:-tests/kernels}; W=${TEST_WORKERS:-4}
        else
          paths=${GPU_TESTS:-"tests/test_gpu_runner.py tests/test_pooling_gpu.py $(grep -l "mark.gpu" tests/test_*.py | grep -v -e test_gpu_runner -e test_pooling_gpu -e test_bench_)"}
          W=${TEST_WORKERS_GPU:-2}
        fi
        XD=(); python3 -c "import xdist" 2>/dev/null && [ "$W" -gt 1 ] && XD=(-n "$W")
        # tests/kernels run on the device they find; in the other files only the gpu-marked tests
        # (their CPU tests, interpreter subprocesses among them, are CI's)
        MARK="gpu or not gpu"; [ "$part" = tests-gpu ] && [ -z "${GPU_TESTS:-}" ] && MARK=gpu
        timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -o faulthandler_timeout=120 --durations=10 -p no:cacheprovider "${XD[@]}" \
          -m "$MARK" $paths 2>&1 | tee "$LOG/${part//-/_}.log" | grep -v -i warning | tail -30
      done;;
    sampler)
      say sampler
      timeout 400 python3 -m core_runner.cli bench --sampler --json "$LOG/sampler.json" 2>&1 | tee -a "$LOG/bench.log" | tail -15;;
    qwen)
      say qwen W1 W2 "${PEER[@]}"
      timeout 480 python3 -m core_runner.cli bench --workload W1 W2 --profile-steps 20 "${N[@]}" "${PEER[@]}" \
        --json "$LOG/qwen.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -40;;
    granite)
      say granite
      FP=(); [ "$FPEER" = 1 ] && FP=(--peer W1 --peer-timeout ${PEER_TIMEOUT:-150})
      timeout 120 python3 -m core_runner_granite_hybrid.bench $CKPT/granite 2>&1 | tail -2
      timeout 400 python3 -m core_runner.cli bench --model $CKPT/granite --workload W1 "${N[@]}" "${FP[@]}" \
        ${GRANITE_PROFILE:+--profile-steps $GRANITE_PROFILE} --json "$LOG/granite.json" 2>&1 | tee -a "$LOG/bench.log" \
        | grep -v Warning | tail -50;;
    deepseek)
      say deepseek
      FP=(); [ "$FPEER" = 1 ] && FP=(--peer W1 --peer-timeout ${PEER_TIMEOUT:-150})  # the HF MoE loop makes a W2 peer run far too long
      [ -f $CKPT/deepseek-yarn/config.json ] || timeout 180 python3 -m core_runner_deepseek.bench $CKPT/deepseek-yarn 2>&1 | tail -2
      timeout 480 python3 -m core_runner.cli bench --model $CKPT/deepseek-yarn --workload ${DS_WORKLOADS:-W1 W2} "${N[@]}" "${FP[@]}" \
        ${DS_PROFILE:+--profile-steps $DS_PROFILE} \
        --json "$LOG/deepseek.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -30;;
    deepseek-w2peer)
      say deepseek W2 prefix next to the transformers peer
      [ -f $CKPT/deepseek-yarn/config.json ] || timeout 180 python3 -m core_runner_deepseek.bench $CKPT/deepseek-yarn 2>&1 | tail -2
      timeout 400 python3 -m core_runner.cli bench --model $CKPT/deepseek-yarn --workload W2 --num-requests ${W2_PEER_N:-4} \
        --peer W2 --peer-timeout ${PEER_TIMEOUT:-200} --json "$LOG/deepseek_w2peer.json" 2>&1 | tee -a "$LOG/bench.log" \
        | grep -v Warning | tail -20;;
    w3)
      say W3 prefix cache on vs off
      timeout 480 python3 -m core_runner.cli bench --workload W3 --prefix-caching on off "${N[@]}" \
        --json "$LOG/w3.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -30;;
    biggraphs)
      say prefill steps from CUDA graphs: W1 W2 with --max-cudagraph-capture-size 8192 '(default 1024)'
      timeout 120 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
        tests/test_gpu_runner.py::test_prefill_steps_replay_graphs_past_1024_tokens 2>&1 | tail -3 | tee -a "$LOG/bench.log"
      timeout 420 python3 -m core_runner.cli bench --workload W1 W2 --max-cudagraph-capture-size 8192 "${N[@]}" \
        --profile-steps 10 --json "$LOG/qwen_graphs8192.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning \
        | grep -e "^W" -e TTFT -e "step wall" -e "prefill steps" | tail -12;;
    best)
      say qwen W1 W2 best settings
      timeout 480 python3 -m core_runner.cli bench --workload W1 W2 --best-settings "${N[@]}" \
        --json "$LOG/qwen_best.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -30;;
    spec)
      # SPEC_PARTS (env) picks parts, e.g. SPEC_PARTS=mtp: the whole stage is ~8 min, near one device call's 10
      for part in ${SPEC_PARTS:-ngram mtp tests}; do
        case $part in
          ngram)
            for t in 0.6 0; do
              J=spec; [ "$t" = 0 ] && J=spec_greedy
              say spec: W2R Qwen3-0.6B shape, temperature $t, off vs n-gram k=3
              timeout 300 python3 -m core_runner.cli bench --workload W2R --temperature $t "${N[@]}" \
                --speculative-config off '{"method":"ngram","num_speculative_tokens":3}' --json "$LOG/$J.json" \
                2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -16
            done;;
          mtp)
            # ~40 GB of bf16 weights built twice (off, then with the MTP layer). A run takes about as many
            # decode steps as the longest output (~1,000) whatever the request count, but fewer requests
            # mean less prefill and attention per step: 128 keeps both runs well inside 480 s
            say spec: W2R deepseek-v3-mtp shape, off vs MTP k=1
            timeout 480 python3 -m core_runner.cli bench --load-format dummy --shape deepseek-v3-mtp --workload W2R \
              --num-requests ${SPEC_MTP_N:-128} "${N[@]}" --json "$LOG/spec_mtp.json" \
              --speculative-config off '{"method":"mtp","num_speculative_tokens":1}' \
              2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -16;;
          tests)
            say spec: GPU tests of speculative decoding
            timeout 300 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/test_spec_gpu.py 2>&1 \
              | tee "$LOG/spec_tests.log" | tail -6 | tee -a "$LOG/bench.log";;
          *) echo "unknown spec part $part (ngram, mtp, tests)";;
        esac
      done;;
    serve)
      say serve: W2 through core-runner serve, 256 streaming clients, vs offline
      python3 -c "import fastapi, uvicorn, prometheus_client" 2>/dev/null || python3 -m pip install -q --no-index \
        --find-links .wheels fastapi uvicorn prometheus_client >>"$LOG/env.log" 2>&1
      # uvloop + httptools, core-runner's dependencies, which uvicorn uses when present
      python3 -c "import uvloop, httptools" 2>/dev/null || python3 -m pip install -q --no-index --find-links .wheels \
        uvloop httptools >>"$LOG/env.log" 2>&1 || true
      # the engine-core process split needs pyzmq + msgspec; without them only the in-process figure comes
      python3 -c "import zmq, msgspec" 2>/dev/null || python3 -m pip install -q --no-index --find-links .wheels \
        pyzmq msgspec >>"$LOG/env.log" 2>&1 || true
      # SERVE_ARGS (env) adds serve_bench options, e.g. "--engine split --profile-api $OUT/api.prof"
      timeout 560 python3 benchmarks/serve_bench.py "${N[@]}" --engine both $SERVE_ARGS --json "$LOG/serve.json" 2>&1 \
        | grep -v -e INFO -e Warning | tail -10 | tee -a "$LOG/bench.log"
      for f in "$LOG"/*.prof.*; do [ -f "$f" ] && python3 -c "import pstats, sys; p = pstats.Stats(sys.argv[1]); \
        p.sort_stats('tottime').print_stats(25); p.sort_stats('cumulative').print_stats('core_runner|starlette|uvicorn', 25)" \
        "$f" 2>&1 | grep -v "^$" | tee -a "$LOG/bench.log"; done;;
    smoke)
      say smoke: fp8 quantization, prefix caching and ngram speculation on CUDA
      timeout 200 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_fp8_block_matmul.py \
        2>&1 | tail -4 | tee -a "$LOG/bench.log"
      timeout 60 python3 benchmarks/fp8_debug.py 2>&1 | tail -12 | tee -a "$LOG/bench.log"
      timeout 240 python3 benchmarks/feature_smoke.py 2>&1 | grep -v Writing | tail -8 | tee -a "$LOG/bench.log";;
    attn)
      say attention launch sweep at the W1 / W2 step shapes
      timeout 420 python3 benchmarks/attn_sweep.py --json "$LOG/attn${ATTN_KV:+_$ATTN_KV}.json" \
        ${ATTN_SHAPES:+--shapes $ATTN_SHAPES} ${ATTN_KV:+--kv-dtype $ATTN_KV} 2>&1 \
        | grep -v Warning | tail -12 | tee -a "$LOG/bench.log";;
    embedprof)
      say embed host profile
      timeout 120 python3 -m cProfile -s tottime -m core_runner.cli bench --embed --model .minilm16 --num-requests 2048 \
        2>&1 | grep -v Warning | head -45 | tee -a "$LOG/bench.log";;
    embed)
      say embed
      timeout 200 python3 -m core_runner.cli bench --embed --model .minilm16 --json "$LOG/embed.json" \
        2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -15;;
    moe-sweep)
      for shape in ${MOE_SHAPES:-v2-lite v3}; do
        say moe sweep $shape
        timeout 400 python3 benchmarks/moe_sweep.py --shape $shape --fuse-activation --json "$LOG/moe_sweep_$shape.json" 2>&1 \
          | tee -a "$LOG/bench.log" | grep -v Warning | grep -e '^T=' -e default -e took | tail -12
      done;;
    moe-align)
      say moe_align: torch vs Triton alignment at V2-Lite / V3 routing
      timeout 200 python3 benchmarks/moe_align_bench.py --json "$LOG/moe_align.json" 2>&1 | tee -a "$LOG/bench.log" \
        | grep -v Warning | tail -12;;
    fp8-moe)
      say fp8 fused MoE: GPU tests, then fp8 vs bf16 at the DeepSeek-V3 layer
      timeout 240 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_fused_moe_fp8.py \
        tests/kernels/test_fused_moe_fp8_layer.py 2>&1 | tail -4 | tee -a "$LOG/bench.log"
      timeout 420 python3 benchmarks/fp8_moe_bench.py ${FP8_MOE_TOKENS:+--tokens $FP8_MOE_TOKENS} \
        --json "$LOG/fp8_moe.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -14;;
    fp8w)
      say fp8w: Qwen3-0.6B shape, bf16 vs fp8 weights W1 W2, fp8 KV W1
      timeout 200 python3 benchmarks/fp8w_bench.py ${FP8W_N:+--num-requests $FP8W_N} ${FP8W_PARTS:+--parts $FP8W_PARTS} \
        --json "$LOG/fp8w.json" 2>&1 | tee -a "$LOG/bench.log" | grep -v Warning | tail -12;;
    so)
      say so: W2 with a JSON schema vs without
      python3 -c "import xgrammar" 2>/dev/null || python3 -m pip install -q --no-index --find-links .wheels xgrammar \
        >>"$LOG/env.log" 2>&1 || echo "xgrammar missing and not installable from .wheels (see env.log)"
      timeout 200 python3 benchmarks/so_bench.py ${SO_N:+--num-requests $SO_N} --json "$LOG/so.json" 2>&1 \
        | tee -a "$LOG/bench.log" | grep -v Warning | tail -6;;
    gemma3)
      say gemma3: gemma-3-1b shape, 8,192-token contexts, window ${GEMMA3_WINDOW:-1024}
      timeout 240 python3 benchmarks/gemma3_bench.py --window ${GEMMA3_WINDOW:-1024} ${GEMMA3_PROFILE:+--profile-steps $GEMMA3_PROFILE} \
        --json "$LOG/gemma3.json" 2>&1 \
        | tee -a "$LOG/bench.log" | grep -v Warning | tail -30;;
    w3granite)
      say w3granite: W3 on the granite-4.0-h-350m shape, prefix cache on vs off
      [ -f $CKPT/granite/config.json ] || timeout 120 python3 -m core_runner_granite_hybrid.bench $CKPT/granite 2>&1 | tail -2
      timeout 240 python3 -m core_runner.cli bench --model $CKPT/granite --workload W3 --prefix-caching on off \
        ${W3G_N:+--num-requests $W3G_N} "${N[@]}" --json "$LOG/w3granite.json" 2>&1 | tee -a "$LOG/bench.log" \
        | grep -v Warning | tail -16;;
    rerank)
      say rerank: cross-encoder pairs/s, LLM.score vs transformers
      timeout 150 python3 benchmarks/rerank_bench.py --max-num-batched-tokens default 8192 --profile --json "$LOG/rerank.json" 2>&1 | tee -a "$LOG/bench.log" \
        | grep -v -e Warning -e "Writing model" -e "Loading weights" -e USDT -e "CUDA profiling" | tail -30;;
    mamba2)
      say mamba2: mamba2-780m shape W1 vs roofline
      timeout 200 python3 -m core_runner.cli bench --load-format dummy --shape mamba2-780m --workload W1 \
        --prefix-caching off --max-num-seqs ${MAMBA2_SEQS:-512} "${N[@]}" --json "$LOG/mamba2.json" 2>&1 \
        | tee -a "$LOG/bench.log" | grep -v Warning | tail -12;;
    conformance)
      say conformance GPU checks
      for ep in qwen3 granite_hybrid deepseek llama_template pooling mistral gemma gpt_oss mamba; do
        timeout 150 python3 -m core_runner.cli conformance $ep --tier gpu --checks CR-EQ-06,CR-EQ-08 -v 2>&1 \
          | grep -E "CR-|passed|failed|error" | tail -12 | tee -a "$LOG/bench.log"
      done;;
    *) echo "unknown stage $s";;
  esac
done
