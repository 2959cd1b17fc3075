#!/usr/bin/env bash
# The Python package on a GPU: the GPU tests (python/tests/test_cuda.py, against PyTorch)
# and the CPU ones, one rank under torchrun, and the host overhead of a call
# (scripts/gpu/python_overhead.py). Run from the repository root with the built package on
# PYTHONPATH (a directory holding streamweave/ with its _native extension):
#   PYTHONPATH=DIR bash scripts/gpu/python_gpu.sh [OUT_DIR]
set -u
OUT_DIR="${1:-${OUT:-./out}}"
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
status=0
echo "== pytest ($(date -u +%FT%TZ))"
timeout -k 10 400 python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT_DIR/pytest.log" 2>&1 || status=1
tail -5 "$OUT_DIR/pytest.log"
echo "== torchrun, 1 process"
timeout -k 10 120 python3 -m torch.distributed.run --nproc-per-node 1 scripts/gpu/python_torchrun.py \
  tests/scenarios/row_parallel_linear.weave t=256 h=64 d=1 s=4 > "$OUT_DIR/torchrun.log" 2>&1 || status=1
grep -E "^rank|Error|error" "$OUT_DIR/torchrun.log" | head -5
echo "== host overhead"
timeout -k 10 300 python3 scripts/gpu/python_overhead.py --out "$OUT_DIR/python_overhead.json" \
  > "$OUT_DIR/python_overhead.log" 2>&1 || status=1
cat "$OUT_DIR/python_overhead.log" | tail -5
exit $status
