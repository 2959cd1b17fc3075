#!/usr/bin/env bash
# The overlap benchmark: streamweave's figures (bin/gpu_overlap: calibration, GEMM and
# collective alone, S sweep, the cost model's choice, experiments, numerics) on 2 and 4 GPUs,
# then PyTorch's reference on the same GPUs right after, merged into one markdown table.
# Run from a bundle: bash scripts/bench.sh [OUT_DIR] [gpu_overlap arguments...]
# RANKS (default 2,4) and HS (default 4096,8192) choose the rows for both sides.
set -u
OUT_DIR="${1:-${OUT:-./out}}"
shift || true
mkdir -p "$OUT_DIR"
RANKS="${RANKS:-2,4}"
HS="${HS:-4096,8192}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
# The calibration measured by this run is what the cost model uses here.
export WEAVE_CALIBRATION="${WEAVE_CALIBRATION:-$OUT_DIR/calibration.txt}"
rm -f "$OUT_DIR/ours.jsonl" "$OUT_DIR/torch.jsonl"

echo "== streamweave ($(date -u +%FT%TZ))"
timeout -k 10 1500 bin/gpu_overlap --ranks "$RANKS" --h "$HS" --out "$OUT_DIR" "$@" \
  > "$OUT_DIR/ours.log" 2>&1
echo "gpu_overlap exit: $?"
grep -E "ERROR|error" "$OUT_DIR/ours.log" | head -20

echo "== PyTorch ($(date -u +%FT%TZ))"
if python3 -c "import torch" 2>/dev/null; then
  timeout -k 10 900 python3 scripts/torch_reference.py --ranks "$RANKS" --h "$HS" \
    --out "$OUT_DIR/torch.jsonl" > "$OUT_DIR/torch.log" 2>&1
  echo "torch_reference exit: $?"
else
  echo "PyTorch is not installed: the PyTorch columns stay empty"
fi

COMMIT="$(grep -m1 -i '^commit' MANIFEST.txt 2>/dev/null | awk '{print $2}')"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
NGPU="$(nvidia-smi -L 2>/dev/null | wc -l)"
python3 scripts/bench_table.py "$OUT_DIR/ours.jsonl" "$OUT_DIR/torch.jsonl" \
  --md "$OUT_DIR/table.md" \
  --header "$(date -u +%F), ${NGPU} x ${GPU:-GPU}, commit ${COMMIT:-unknown}, NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
