#!/usr/bin/env bash
# Copy-engine reductions side by side with NCCL on rank threads (one process, one GPU per
# rank): every row runs `weave run` with `--transport nccl` and `--transport copy-engine`
# (each window shape of SHAPES, through WEAVE_CE_WINDOWS), for every chunk count of CHUNKS,
# tuning off, graph replay on (the default), W warm-up and I timed runs, then the same
# configuration checked against the reference at a small size.
# Run from a bundle: bash scripts/ce_reduce.sh [OUT_DIR]
# RANKS (4), T (8192), HS ("8192"), FIXTURES ("matmul_rs row_parallel_linear"),
# CHUNKS ("1 2 4"), SHAPES ("2x8 4x16 2x32"; SLOTSxMIB), WARMUP (5), ITERS (20).
set -u
OUT_DIR="${1:-${OUT:-./out}}/ce-reduce"
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
RANKS="${RANKS:-4}"
T="${T:-8192}"
HS="${HS:-8192}"
FIXTURES="${FIXTURES:-matmul_rs row_parallel_linear}"
CHUNKS="${CHUNKS:-1 2 4}"
SHAPES="${SHAPES:-2x8 4x16 2x32}"
WARMUP="${WARMUP:-5}"
ITERS="${ITERS:-20}"
TABLE="$OUT_DIR/table.md"
median() {
  python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['timed_median_ms'])" "$1" 2>/dev/null || echo ERR
}
header="| fixture | d | h | S | nccl |"
rule="|---|---:|---:|---:|---:|"
for shape in $SHAPES; do header="$header ce $shape |"; rule="$rule---:|"; done
echo "$header checks (small, ce) |" >"$TABLE"
echo "$rule---|" >>"$TABLE"
for d in $RANKS; do
  for h in $HS; do
    for f in $FIXTURES; do
      for s in $CHUNKS; do
        base="$OUT_DIR/$f.d$d.h$h.s$s"
        run() { # transport shape json
          WEAVE_CE_WINDOWS="$2" timeout -k 10 240 bin/weave run "scenarios/$f.weave" --backend cuda \
            --ranks "$d" --set "d=$d" --set "t=$T" --set "h=$h" --chunks "$s" --no-tune \
            --transport "$1" --warmup "$WARMUP" --iters "$ITERS" --no-check --json "$3" >"${3%.json}.log" 2>&1
        }
        run nccl 2x8 "$base.nccl.json"
        line="| $f | $d | $h | $s | $(median "$base.nccl.json") |"
        for shape in $SHAPES; do
          run copy-engine "$shape" "$base.ce$shape.json"
          line="$line $(median "$base.ce$shape.json") |"
        done
        # Numbers: the same chunking at a size the f64 reference checks quickly.
        check="$base.check.log"
        WEAVE_CE_WINDOWS="${SHAPES%% *}" timeout -k 10 240 bin/weave run "scenarios/$f.weave" \
          --backend cuda --ranks "$d" --set "d=$d" --set "t=$((64 * d * s))" --set "h=256" \
          --chunks "$s" --no-tune --transport copy-engine >"$check" 2>&1
        rc=$?
        line="$line $(grep -ho 'result: [A-Z]*' "$check" | tail -1 | sed 's/result: //') rc$rc |"
        echo "$line" | tee -a "$TABLE"
      done
    done
  done
done
