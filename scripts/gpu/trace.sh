#!/usr/bin/env bash
# The row-parallel linear at t = h = 8192 with s = 4 chunks on 2 GPUs, traced with CUDA
# events after two warm-up runs: the timeline shows later chunks' GEMMs running while earlier
# chunks' allreduces are in flight. Run from a bundle: bash scripts/trace.sh [OUT_DIR]
set -u
OUT_DIR="${1:-${OUT:-./out}}"
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
for streams in 2 4; do
  timeout -k 5 240 bin/weave run scenarios/row_parallel_linear.weave --backend cuda --ranks 2 \
    --set t=8192 --set h=8192 --set s=4 --streams "$streams" --warmup 2 \
    --trace "$OUT_DIR/row_parallel_s4_streams$streams.json" 2>&1 | tail -8
done
