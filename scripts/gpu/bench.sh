#!/usr/bin/env bash
# The overlap benchmark: streamweave's figures (bin/gpu_overlap: calibration, GEMMs and
# collectives alone, S sweep, the cost model's choice, experiments, numerics) on 2 and 4 GPUs,
# then what a user gets by default (bin/weave run on every row, every option default, a fresh
# tuning cache), then PyTorch's reference on the same GPUs, merged into one markdown table.
# Run from a bundle: bash scripts/bench.sh [OUT_DIR] [gpu_overlap arguments...]
#
# Environment (each chooses the rows or runs of every side):
#   RANKS (default 2,4)   world sizes;   HS (default 4096,8192)   hidden sizes;   T (8192) tokens
#   PATTERNS (default row-parallel,column-parallel,matmul+rs,p2p-ring,sp-mlp,matmul+rs-ring,
#            sp-mlp-ring,row-parallel-ring; the -ring ones are default runs only: the layer
#            written with one stream chunk per device, compared with its base pattern's figures)
#   DEFAULT=0             skip the default runs
#   DEFAULT_TIMEOUT (300) seconds per default run; DEFAULT_WARMUP (5), DEFAULT_ITERS (20)
#   DEFAULT_CALIBRATION   WEAVE_CALIBRATION of the default runs (default: a fresh, missing
#                         OUT_DIR/default-calibration.txt, as on a machine never calibrated;
#                         OUT_DIR/calibration.txt is the one gpu_overlap measured)
#   TORCH_JSONL           PyTorch's figures already measured on these GPUs in the same session
#                         (scripts/torch_reference.py --out FILE, run first so that a time
#                         limit cannot cut it): copied to OUT_DIR/torch.jsonl instead of
#                         running PyTorch again
# Writes into OUT_DIR: ours.{jsonl,log}, calibration.txt, default-ROW.{json,log} and
# default.jsonl (ROW = PATTERN-dD-hH), tune.toml (the default runs' tuning cache), torch.{jsonl,log},
# table.md (the full table and every experiment), table-short.md, and details.tar.gz (all of
# it); prints the short table last, ending with the summary of the default targets met.
set -u
OUT_DIR="${1:-${OUT:-./out}}"
shift || true
mkdir -p "$OUT_DIR" || exit 2
RANKS="${RANKS:-2,4}"
HS="${HS:-4096,8192}"
T="${T:-8192}"
PATTERNS="${PATTERNS:-row-parallel,column-parallel,matmul+rs,p2p-ring,sp-mlp,matmul+rs-ring,sp-mlp-ring,row-parallel-ring}"
# gpu_overlap measures the base patterns (a -ring pattern's base is the same layer).
OVERLAP_PATTERNS="$(echo "${PATTERNS//,/ }" | tr ' ' '\n' | sed 's/-ring$//;s/^p2p$/p2p-ring/' \
  | awk 'NF && !seen[$0]++' | paste -sd, -)"
DEFAULT="${DEFAULT:-1}"
DEFAULT_TIMEOUT="${DEFAULT_TIMEOUT:-300}"
DEFAULT_WARMUP="${DEFAULT_WARMUP:-5}"
DEFAULT_ITERS="${DEFAULT_ITERS:-20}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
# The calibration measured by this run is what the cost model of gpu_overlap uses here.
export WEAVE_CALIBRATION="${WEAVE_CALIBRATION:-$OUT_DIR/calibration.txt}"
# The default runs tune on their first run (a fresh cache: nothing tuned before this run).
export WEAVE_TUNE_CACHE="$OUT_DIR/tune.toml"
DEFAULT_CALIBRATION="${DEFAULT_CALIBRATION:-$OUT_DIR/default-calibration.txt}"
rm -f "$OUT_DIR/ours.jsonl" "$OUT_DIR/torch.jsonl" "$OUT_DIR/default.jsonl" \
  "$OUT_DIR"/default-*.json "$OUT_DIR"/default-*.log "$OUT_DIR/tune.toml" \
  "$OUT_DIR/default-calibration.txt" "$OUT_DIR/table.md" "$OUT_DIR/table-short.md" \
  "$OUT_DIR/details.tar.gz"

# Every step runs as a child this script waits for, and a signal to the script (a `timeout`
# around it, a Ctrl-C) ends that child's process group with it: a step left running would
# hold the GPUs beside the next call's figures. (`timeout` puts its command in a group of its
# own; bash runs a trap only once the foreground command is done, so steps run in the
# background and are waited for.)
CHILD=
stop() {
  trap - TERM INT HUP
  if [ -n "$CHILD" ]; then
    kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null
    sleep 2
    kill -KILL -- "-$CHILD" 2>/dev/null
  fi
  echo "bench.sh: stopped by a signal" >&2
  exit 143
}
trap stop TERM INT HUP
# bounded SECONDS COMMAND...: COMMAND under `timeout` (killed 5-10 s after SECONDS), waited for.
bounded() {
  local secs="$1"
  shift
  timeout -k 10 "$secs" "$@" &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=
  return "$rc"
}

echo "== streamweave ($(date -u +%FT%TZ))"
bounded 1800 bin/gpu_overlap --ranks "$RANKS" --h "$HS" --t "$T" --patterns "$OVERLAP_PATTERNS" \
  --out "$OUT_DIR" "$@" > "$OUT_DIR/ours.log" 2>&1
echo "gpu_overlap exit: $?"
grep -E "ERROR|error" "$OUT_DIR/ours.log" | head -20

# The fixture of each pattern (gpu_overlap.rs, Pattern::fixture) and its parameters beyond
# t, h and d (the chunk count is left to the product).
fixture_of() {
  case "$1" in
    row-parallel) echo row_parallel_linear ;;
    column-parallel) echo column_parallel_chunked ;;
    matmul+rs) echo matmul_rs ;;
    p2p-ring) echo column_parallel_p2p ;;
    sp-mlp) echo sequence_parallel_mlp_block ;;
    matmul+rs-ring) echo matmul_rs_ring ;;
    row-parallel-ring) echo row_parallel_ring ;;
    sp-mlp-ring) echo sequence_parallel_mlp_ring ;;
    *) return 1 ;;
  esac
}
extra_sets() {
  case "$1" in
    sp-mlp|sp-mlp-ring) echo "--set f=$((4 * $2))" ;;
  esac
}

# One line of default.jsonl from a default run: its --json summary (timed_median_ms, ...) and
# the `chunks:` and `config:` lines of its stdout.
default_row() {
  python3 - "$@" <<'PY'
import json, re, sys
path, log, pattern, d, t, h, rc = sys.argv[1:8]
try:
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    if not isinstance(summary, dict):
        summary = {}
except (OSError, ValueError):
    summary = {}
chunks, config = [], None
try:
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = re.sub(r"^\[rank \d+\] ", "", line.strip())
            if line.startswith("chunks:"):
                chunks.append(line[len("chunks:"):].strip())
            elif line.startswith("config:") and config is None:
                config = line[len("config:"):].strip()
except OSError:
    pass
s = None
for text in ([config] if config else []) + chunks:
    m = re.search(r"\bS=(\d+)", text) or re.search(r"auto -> (\d+)", text)
    if m:
        s = int(m.group(1))
        break
rc = int(rc) if rc.lstrip("-").isdigit() else None
error = summary.get("error")
if error is None and rc != 0:
    error = "timed out" if rc in (124, 137) else "exit %s" % rc
row = {
    "source": "streamweave-default", "pattern": pattern, "d": int(d), "t": int(t),
    "h": int(h), "ms": summary.get("timed_median_ms"), "min_ms": summary.get("timed_min_ms"),
    "replayed": summary.get("timed_replayed"), "s": s, "config": config, "chunks": chunks,
    "rc": rc, "error": error, "json": path, "log": log,
}
print(json.dumps(row))
PY
}

if [ "$DEFAULT" != 0 ]; then
  echo "== default runs ($(date -u +%FT%TZ)): bin/weave run, every option default"
  NGPU="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
  for d in ${RANKS//,/ }; do
    if [ "$d" -gt "${NGPU:-0}" ]; then
      echo "d=$d: skipped, ${NGPU:-0} GPU(s)"
      continue
    fi
    for h in ${HS//,/ }; do
      for p in ${PATTERNS//,/ }; do
        fx="$(fixture_of "$p")" || { echo "$p: no fixture known, skipped"; continue; }
        row="${p//+/_}-d$d-h$h"
        json="$OUT_DIR/default-$row.json"
        log="$OUT_DIR/default-$row.log"
        # shellcheck disable=SC2046
        WEAVE_CALIBRATION="$DEFAULT_CALIBRATION" bounded "$DEFAULT_TIMEOUT" \
          bin/weave run "scenarios/$fx.weave" --backend cuda --ranks "$d" --set d="$d" \
          --set t="$T" --set h="$h" $(extra_sets "$p" "$h") --warmup "$DEFAULT_WARMUP" \
          --iters "$DEFAULT_ITERS" --no-check --json "$json" > "$log" 2>&1
        rc=$?
        default_row "$json" "$log" "$p" "$d" "$T" "$h" "$rc" >> "$OUT_DIR/default.jsonl"
        echo "$row: rc=$rc $(tail -n 1 "$OUT_DIR/default.jsonl" | python3 -c \
          'import json,sys; r=json.load(sys.stdin); print(r["ms"], "ms", r["config"] or "")' 2>/dev/null)"
      done
    done
  done
fi

echo "== PyTorch ($(date -u +%FT%TZ))"
if [ -n "${TORCH_JSONL:-}" ]; then
  cp "$TORCH_JSONL" "$OUT_DIR/torch.jsonl" && echo "PyTorch: the figures of $TORCH_JSONL"
elif python3 -c "import torch" 2>/dev/null; then
  bounded 1200 python3 scripts/torch_reference.py --ranks "$RANKS" --h "$HS" --t "$T" \
    --out "$OUT_DIR/torch.jsonl" > "$OUT_DIR/torch.log" 2>&1
  echo "torch_reference exit: $?"
else
  echo "PyTorch is not installed: the PyTorch columns stay empty"
fi

COMMIT="$(grep -m1 -i '^commit' MANIFEST.txt 2>/dev/null | awk '{print $2}')"
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
NGPU="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
python3 scripts/bench_table.py "$OUT_DIR/ours.jsonl" "$OUT_DIR/torch.jsonl" \
  --default "$OUT_DIR/default.jsonl" --md "$OUT_DIR/table.md" \
  --short-md "$OUT_DIR/table-short.md" --short \
  --header "$(date -u +%F), ${NGPU} x ${GPU:-GPU}, commit ${COMMIT:-unknown}, NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE" \
  > /dev/null
table_rc=$?

# Everything detailed in one archive (the device returns few files), then the short table last.
( cd "$OUT_DIR" && find . -mindepth 1 -maxdepth 1 ! -name details.tar.gz ! -name details.tar.gz.tmp \
    -printf '%P\0' | tar -czf details.tar.gz.tmp --null -T - && mv details.tar.gz.tmp details.tar.gz ) \
  && echo "details: $OUT_DIR/details.tar.gz (full table: $OUT_DIR/table.md)"
echo
if [ -s "$OUT_DIR/table-short.md" ]; then
  cat "$OUT_DIR/table-short.md"
else
  echo "bench_table.py exit $table_rc: no table (see $OUT_DIR/ours.log, $OUT_DIR/torch.log)"
fi
