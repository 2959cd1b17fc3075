#!/usr/bin/env bash
# The command-line fuzz harness (tests/fuzz_cli.rs, bundled as bin/fuzz-cli) on a machine with
# many cores and no Rust toolchain: JOBS workers run `bin/weave run|dump` with hostile flags,
# paths and signals for MINUTES minutes. Needs no GPU.
#
# From the bundle directory:
#   MINUTES=10 JOBS=48 bash scripts/fuzz_cli.sh
# MINUTES (default 5), JOBS (default 3/4 of the cores), SEED (the first seed; default the
# time, so each run tries new seeds), OUT (a directory for the details: the whole log, the
# summary, every find with its replay entry), BUNDLE (default: the directory above scripts/).
# The summary goes to stdout; the exit status is the harness's (0: no find), 124 when the
# `timeout` that bounds the whole run (MINUTES + 5 minutes) stopped it. Replay a find with
# REPLAY=SEED:CASE[,SEED:CASE...] (same machine kind: cases depend on running as root).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
B="${BUNDLE:-$(dirname "$here")}"
B="$(cd "$B" && pwd)"
if [ ! -x "$B/bin/fuzz-cli" ] || [ ! -x "$B/bin/weave" ]; then
  echo "error: $B/bin/fuzz-cli or $B/bin/weave is missing: run from a bundle made by 'cargo xtask gpu-bundle', or set BUNDLE" >&2
  exit 2
fi
cores="$(nproc 2>/dev/null || echo 4)"
MINUTES="${MINUTES:-5}"
JOBS="${JOBS:-$(( cores * 3 / 4 > 0 ? cores * 3 / 4 : 1 ))}"
SEED="${SEED:-$(date +%s)}"
case "$MINUTES$JOBS$SEED" in
  *[!0-9]*) echo "error: MINUTES, JOBS and SEED are whole numbers" >&2; exit 2 ;;
esac
export WEAVE_BIN="$B/bin/weave"
export WEAVE_SCENARIOS="$B/scenarios"
export WEAVE_FUZZ_CLI_MINUTES="$MINUTES"
export WEAVE_FUZZ_CLI_JOBS="$JOBS"
export WEAVE_FUZZ_CLI_SEED="$SEED"
export TMPDIR="${TMPDIR:-/tmp}"
if [ -n "${REPLAY:-}" ]; then
  export WEAVE_FUZZ_CLI_REPLAY="$REPLAY"
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  export WEAVE_FUZZ_CLI_OUT="$OUT"
  log="$OUT/fuzz_cli.log"
  : >"$log"
else
  log="$(mktemp "$TMPDIR/fuzz_cli.XXXXXX.log")"
fi
limit=$(( MINUTES * 60 + 300 ))
echo "fuzz_cli: $JOBS worker(s) for $MINUTES minute(s), first seed $SEED, $cores cores, bundle $B (bounded to ${limit} s)"
# Both tests: the replayed finds, then the fuzz. The summary lines and the verdict go to
# stdout; the whole output, with each find's details, to the log ($OUT/fuzz_cli.log).
timeout -k 30 "$limit" "$B/bin/fuzz-cli" --nocapture --test-threads 2 >"$log" 2>&1
rc=$?
grep -E '^fuzz_cli: |^test |panicked' "$log" | grep -v '^fuzz_cli: find: ' || true
if [ -z "${OUT:-}" ]; then
  if [ "$rc" -ne 0 ]; then
    echo "--- the run failed (rc=$rc); the end of its output:"
    tail -c 20000 "$log"
  fi
  rm -f "$log"
fi
[ "$rc" -eq 124 ] && echo "fuzz_cli: stopped by the ${limit} s timeout"
echo "fuzz_cli: rc=$rc"
exit "$rc"
