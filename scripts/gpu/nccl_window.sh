#!/usr/bin/env bash
# NCCL's ways of leaving SMs to the GEMM, side by side on rank threads (one process, one GPU
# per rank): every row runs `weave run` with each variant of VARIANTS (NCCL as is, NCCL's
# efficiency CTA policy, a symmetric window, a symmetric window with the zero-CTA policy,
# copy-engine transport), for every chunk count of CHUNKS, tuning off, graph replay on (the
# default), W warm-up and I timed runs; then each window variant checked against the
# reference at a small size.
# Run from a bundle: bash scripts/nccl_window.sh [OUT_DIR]
# RANKS (4), T (8192), HS ("8192"), FIXTURES ("matmul_rs row_parallel_linear
# column_parallel_chunked"), CHUNKS ("1 2"), WINDOW_MIB (256), WARMUP (5), ITERS (20).
set -u
OUT_DIR="${1:-${OUT:-./out}}/nccl-window"
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
RANKS="${RANKS:-4}"
T="${T:-8192}"
HS="${HS:-8192}"
FIXTURES="${FIXTURES:-matmul_rs row_parallel_linear column_parallel_chunked}"
CHUNKS="${CHUNKS:-1 2}"
WINDOW_MIB="${WINDOW_MIB:-256}"
WARMUP="${WARMUP:-5}"
ITERS="${ITERS:-20}"
VARIANTS=(
  "nccl|--transport nccl"
  "efficiency|--nccl-cta-policy efficiency"
  "window|--nccl-window-mib $WINDOW_MIB"
  "window+zero|--nccl-window-mib $WINDOW_MIB --nccl-cta-policy zero"
  "copy-engine|--transport copy-engine"
)
TABLE="$OUT_DIR/table.md"
median() {
  python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['timed_median_ms'])" "$1" 2>/dev/null || echo ERR
}
header="| fixture | d | h | S |"
rule="|---|---:|---:|---:|"
for v in "${VARIANTS[@]}"; do header="$header ${v%%|*} |"; rule="$rule---:|"; done
echo "$header checks (small: window, window+zero) |" >"$TABLE"
echo "$rule---|" >>"$TABLE"
for d in $RANKS; do
  for h in $HS; do
    for f in $FIXTURES; do
      for s in $CHUNKS; do
        base="$OUT_DIR/$f.d$d.h$h.s$s"
        line="| $f | $d | $h | $s |"
        for v in "${VARIANTS[@]}"; do
          name="${v%%|*}"
          # shellcheck disable=SC2086
          timeout -k 10 240 bin/weave run "scenarios/$f.weave" --backend cuda \
            --ranks "$d" --set "d=$d" --set "t=$T" --set "h=$h" --chunks "$s" --no-tune \
            ${v#*|} --warmup "$WARMUP" --iters "$ITERS" --no-check \
            --json "$base.$name.json" >"$base.$name.log" 2>&1
          line="$line $(median "$base.$name.json") |"
        done
        checks=""
        for flags in "--nccl-window-mib 1" "--nccl-window-mib 1 --nccl-cta-policy zero"; do
          check="$base.check.$(echo "$flags" | tr -c 'a-z0-9' '_').log"
          # shellcheck disable=SC2086
          timeout -k 10 240 bin/weave run "scenarios/$f.weave" --backend cuda --ranks "$d" \
            --set "d=$d" --set "t=$((64 * d * s))" --set "h=256" --chunks "$s" --no-tune \
            $flags --warmup 1 --iters 2 >"$check" 2>&1
          rc=$?
          checks="$checks $(grep -ho 'result: [A-Z]*' "$check" | tail -1 | sed 's/result: //')/rc$rc"
        done
        echo "$line$checks |" | tee -a "$TABLE"
      done
    done
  done
done
