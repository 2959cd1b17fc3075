#!/usr/bin/env bash
# Copy-engine transfers between processes (CUDA IPC windows) side by side with NCCL, on
# launched ranks (one process per GPU under `weave launch`): each configuration runs with
# `--transport nccl` and `--transport copy-engine`, W warm-up runs, I timed runs (median and
# minimum of each run's slowest rank), then the run checked against the reference.
# Run from a bundle: bash scripts/copy_engine.sh [OUT_DIR]
# RANKS (default "2 4"), SIZES (default "2048x1024"; t x h), CHUNKS (default "1 2 4"),
# WARMUP (default 5), ITERS (default 20).
set -u
OUT_DIR="${1:-${OUT:-./out}}/copy-engine"
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
RANKS="${RANKS:-2 4}"
SIZES="${SIZES:-2048x1024}"
CHUNKS="${CHUNKS:-1 2 4}"
WARMUP="${WARMUP:-5}"
ITERS="${ITERS:-20}"
TABLE="$OUT_DIR/table.md"
echo "| pattern | d | t | h | S | nccl median ms | copy-engine median ms | ratio | checks |" >"$TABLE"
echo "|---|---|---|---|---|---|---|---|---|" >>"$TABLE"
for r in $RANKS; do
  for size in $SIZES; do
    t="${size%x*}"; h="${size#*x}"
    for name in column_parallel_chunked column_parallel_p2p; do
      for s in $CHUNKS; do
        # The P2P ring has one chunk per rank: S does not apply.
        if [ "$name" = column_parallel_p2p ] && [ "$s" != 1 ]; then continue; fi
        declare -A med=() res=()
        for tr in nccl copy-engine; do
          log="$OUT_DIR/$name.d$r.t$t.h$h.s$s.$tr.log"
          json="$OUT_DIR/$name.d$r.t$t.h$h.s$s.$tr.json"
          timeout -k 10 240 bin/weave launch -n "$r" --timeout-secs 200 -- \
            bin/weave run "scenarios/$name.weave" --backend cuda --ranks "$r" \
            --set "t=$t" --set "h=$h" --chunks "$s" --warmup "$WARMUP" --iters "$ITERS" \
            --transport "$tr" --json "$json" >"$log" 2>&1
          rc=$?
          med[$tr]="$(python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['timed_median_ms'])" "$json" 2>/dev/null || echo ERR)"
          res[$tr]="$(grep -ho 'result: [A-Z]*' "$log" | tail -1 | sed 's/result: //')rc$rc"
        done
        ratio="$(python3 -c "import sys; a,b=sys.argv[1:3]; print('%.2f' % (float(b)/float(a)))" "${med[nccl]}" "${med[copy-engine]}" 2>/dev/null || echo -)"
        line="| $name | $r | $t | $h | $s | ${med[nccl]} | ${med[copy-engine]} | $ratio | ${res[nccl]} / ${res[copy-engine]} |"
        echo "$line" | tee -a "$TABLE"
        unset med res
      done
    done
  done
done
