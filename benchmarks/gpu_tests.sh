#!/usr/bin/env bash
# Every GPU test in two parallel pytest runs (tests/kernels, then the gpu-marked files), so the
# whole set fits one device call; logs to LOGDIR/kernels.log and LOGDIR/gpu_tests.log.
#   benchmarks/gpu_tests.sh LOGDIR [KERNEL_WORKERS] [GPU_WORKERS]
set -uo pipefail
LOG=${1:?usage: gpu_tests.sh LOGDIR [KERNEL_WORKERS] [GPU_WORKERS]}
KW=${2:-6}; GW=${3:-3}
mkdir -p "$LOG"
cd "$(dirname "$0")/.."
PP=$PWD; for p in plugins/*/ examples/plugin_template/; do PP=$PP:$PWD/${p%/}; done
export PYTHONPATH=$PP${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
pipargs=(-e . -e examples/plugin_template); for p in plugins/*/; do pipargs+=(-e "${p%/}"); done
python3 -m pip install -q --no-deps --no-build-isolation "${pipargs[@]}" >"$LOG/env.log" 2>&1 || echo "editable install failed"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$LOG/env.log"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$LOG/env.log"
xd() { python3 -c "import xdist" 2>/dev/null && echo "-n $1" || true; }
echo "=== kernels ($(date +%T))"
timeout ${KERNEL_TIMEOUT:-280} python3 -m pytest -q $(xd "$KW") -o faulthandler_timeout=200 -p no:cacheprovider \
  -m "gpu or not gpu" tests/kernels 2>&1 | tee "$LOG/kernels.log" | grep -v -i warning | grep -E "FAILED|ERROR|passed|failed" | tail -40
echo "=== gpu-marked files ($(date +%T))"
timeout ${GPU_TIMEOUT:-280} python3 -m pytest -q $(xd "$GW") -o faulthandler_timeout=200 -p no:cacheprovider -m gpu \
  $(grep -l "mark.gpu" tests/test_*.py) 2>&1 | tee "$LOG/gpu_tests.log" | grep -v -i warning \
  | grep -E "FAILED|ERROR|passed|failed" | tail -40
echo "=== done ($(date +%T))"
