#!/usr/bin/env bash
# Run every GPU check and the benchmarks in one go; logs go to the folder given.
#   benchmarks/gpu_check.sh LOGDIR [--quick] [--peer]
set -uo pipefail
LOG=${1:?usage: gpu_check.sh LOGDIR [--quick] [--peer]}
shift
QUICK=0; PEER=""
for a in "$@"; do case $a in --quick) QUICK=1;; --peer) PEER="--peer";; esac; done
mkdir -p "$LOG"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/plugins/qwen3${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . -e plugins/qwen3 >"$LOG/install.log" 2>&1 \
  || echo "editable install failed (see install.log); using PYTHONPATH"
{ nvidia-smi; python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"; git rev-parse HEAD 2>/dev/null; } >"$LOG/env.log" 2>&1
python3 -m pytest -q -x -m gpu tests/kernels tests/test_gpu_runner.py 2>&1 | tee "$LOG/gpu_tests.log" | tail -30
if [ "$QUICK" = 1 ]; then
  python3 -m core_runner.cli bench --workload W1 W2 --num-requests 64 --json "$LOG/bench_quick.json" -v 2>&1 | tee "$LOG/bench.log" | grep -v "^INFO" | tail -40
else
  python3 -m core_runner.cli bench --workload W1 W2 --profile-steps 20 $PEER --json "$LOG/bench.json" 2>&1 | tee "$LOG/bench.log" | tail -40
fi
