#!/usr/bin/env bash
# Run every GPU check and the benchmarks in one go; logs go to the folder given.
#   benchmarks/gpu_check.sh LOGDIR [--quick] [--peer W1 ...] [--no-tests]
set -uo pipefail
LOG=${1:?usage: gpu_check.sh LOGDIR [--quick] [--peer W1 W2] [--no-tests]}
shift
QUICK=0; TESTS=1; PEER=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1;;
    --no-tests) TESTS=0;;
    --peer) PEER=(--peer); shift; while [ $# -gt 0 ] && [[ $1 != --* ]]; do PEER+=("$1"); shift; done; continue;;
  esac
  shift
done
mkdir -p "$LOG"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/plugins/qwen3${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 >"$LOG/install.log" 2>&1 \
  || echo "editable install failed (see install.log); using PYTHONPATH"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} >"$LOG/env.log" 2>&1
cat "$LOG/env.log"
if [ "$TESTS" = 1 ]; then
  timeout 240 python3 -m pytest -q -o faulthandler_timeout=100 --durations=8 -m gpu tests \
    2>&1 | tee "$LOG/gpu_tests.log" | tail -25
fi
if [ "$QUICK" = 1 ]; then
  timeout 200 python3 -m core_runner.cli bench --workload W1 W2 --num-requests 64 --json "$LOG/bench_quick.json" 2>&1 | tee "$LOG/bench.log" | tail -30
else
  timeout 420 python3 -m core_runner.cli bench --workload W1 W2 --profile-steps 20 "${PEER[@]}" --json "$LOG/bench.json" 2>&1 | tee "$LOG/bench.log" | grep -v Warning | tail -40
fi
