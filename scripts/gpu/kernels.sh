#!/usr/bin/env bash
# The single-GPU kernel benchmark: streamweave's generated kernels (bin/gpu_kernels over
# scenarios/kernels/*.weave) and PyTorch eager / torch.compile on the same cases and shapes
# (scripts/kernels_torch.py), each beside a device-to-device memcpy of the same bytes, then
# one markdown table printed last.
# Run from a bundle: bash scripts/kernels.sh [OUT_DIR] [gpu_kernels arguments...]
# SHAPES (default 16384x8192,4096x4096), CASES (default all), WARMUP (5) and ITERS (50)
# choose the rows for both sides.
set -u
OUT_DIR="${1:-${OUT:-./out}}"
shift || true
mkdir -p "$OUT_DIR"
SHAPES="${SHAPES:-16384x8192,4096x4096}"
WARMUP="${WARMUP:-5}"
ITERS="${ITERS:-50}"
CASE_ARGS=()
TORCH_CASES=()
if [ -n "${CASES:-}" ]; then
  CASE_ARGS=(--cases "$CASES")
  TORCH_CASES=(--cases "$CASES")
fi
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
rm -f "$OUT_DIR/kernels_ours.json" "$OUT_DIR/kernels_torch.json"

echo "== streamweave ($(date -u +%FT%TZ))"
timeout -k 10 600 bin/gpu_kernels --scenarios scenarios/kernels --shapes "$SHAPES" \
  --warmup "$WARMUP" --iters "$ITERS" "${CASE_ARGS[@]}" \
  --out "$OUT_DIR/kernels_ours.json" "$@" > "$OUT_DIR/kernels_ours.log" 2>&1
echo "gpu_kernels exit: $?"
grep -E "ERROR|error|FAIL|skipped" "$OUT_DIR/kernels_ours.log" | head -20

echo "== PyTorch ($(date -u +%FT%TZ))"
if python3 -c "import torch" 2>/dev/null; then
  timeout -k 10 900 python3 scripts/kernels_torch.py --shapes "$SHAPES" \
    --warmup "$WARMUP" --iters "$ITERS" "${TORCH_CASES[@]}" \
    --out "$OUT_DIR/kernels_torch.json" > "$OUT_DIR/kernels_torch.log" 2>&1
  echo "kernels_torch exit: $?"
  grep -E "ERROR|Error|skipped" "$OUT_DIR/kernels_torch.log" | head -20
else
  echo "PyTorch is not installed: the PyTorch columns stay empty"
fi

COMMIT="$(grep -m1 -i '^commit' MANIFEST.txt 2>/dev/null | awk '{print $2}')"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
python3 scripts/kernels_table.py "$OUT_DIR/kernels_ours.json" "$OUT_DIR/kernels_torch.json" \
  --md "$OUT_DIR/kernels_table.md" \
  --header "$(date -u +%F), ${GPU:-GPU}, commit ${COMMIT:-unknown}, warmup $WARMUP, iters $ITERS, medians"
