#!/usr/bin/env bash
# A quick check of a GPU bundle: a few scenarios on 2 GPUs in threads mode and one launched.
# Run from the repository root on the GPU machine: bash scripts/gpu/smoke.sh [BUNDLE]
set -u
B="${1:-target/gpu-bundle}"
export NCCL_NVLS_ENABLE=0
nvidia-smi -L
run() {
  echo "=== $*"
  timeout -k 5 60 "$B/bin/weave" run "$@" 2>&1 | tail -12
  echo "rc=${PIPESTATUS[0]}"
}
run "$B/scenarios/row_parallel_linear.weave" --backend cuda --ranks 2 --set t=256 --set h=128
run "$B/scenarios/single_binary_op.weave" --backend cuda --ranks 2
run "$B/scenarios/reduction.weave" --backend cuda --ranks 2
run "$B/scenarios/ag_matmul.weave" --backend cuda --ranks 2
echo "=== launch"
timeout -k 5 90 "$B/bin/weave" launch -n 2 --timeout-secs 60 -- "$B/bin/weave" run \
  "$B/scenarios/row_parallel_linear.weave" --backend cuda --set t=256 --set h=128 2>&1 | tail -20
