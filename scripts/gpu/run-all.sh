#!/usr/bin/env bash
# Runs the GPU checks of a bundle made by `cargo xtask gpu-bundle`, on the GPU machine (no
# Rust toolchain needed), from the bundle directory:
#
#   bash scripts/run-all.sh [--ranks "2 4"] [--modes "threads launch"]
#                           [--scenarios "NAME ..."] [--no-tests] [--out DIR]
#
# 1. prints `nvidia-smi -L` and keeps NCCL_NVLS_ENABLE=0 (exported when unset);
# 2. runs bin/gpu-tests (when present) with WEAVE_GPU_TESTS=1, one test at a time, within
#    TEST_TIMEOUT seconds (default 300);
# 3. runs every scenarios/*.weave on the CUDA backend for every rank count (those above the
#    GPU count are skipped), once with in-process rank threads and once with one process per
#    rank under `weave launch` (modes `threads` and `launch`; `threads-ce` and `launch-ce`
#    run the same with `--transport copy-engine`);
# 4. prints a table of the results (scripts/table.py), last, and exits non-zero when
#    anything failed.
#
# DIR (default: $OUT when set, else ./out) receives gpu-tests.log, logs/NAME.R.MODE.log,
# json/NAME.R.MODE.json, attempted.txt (`NAME R MODE RC [REASON]`, RC `skipped` for skips)
# and table.md. Every command runs under `timeout`, so the script cannot hang.

set -u

usage() {
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
}

RANKS="2 4"
MODES="threads launch"
ONLY=""
RUN_TESTS=1
OUT_DIR="${OUT:-./out}"

while [ "$#" -gt 0 ]; do
    case "$1" in
        --ranks) RANKS="${2:?--ranks needs a value}"; shift 2 ;;
        --modes) MODES="${2:?--modes needs a value}"; shift 2 ;;
        --scenarios) ONLY="${2:?--scenarios needs a value}"; shift 2 ;;
        --out) OUT_DIR="${2:?--out needs a value}"; shift 2 ;;
        --no-tests) RUN_TESTS=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run-all.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

for r in $RANKS; do
    case "$r" in
        ''|*[!0-9]*|0) echo "run-all.sh: --ranks: \`$r\` is not a positive number" >&2; exit 2 ;;
    esac
done

# Resolve DIR before moving to the bundle directory.
case "$OUT_DIR" in
    /*) ;;
    *) OUT_DIR="$PWD/$OUT_DIR" ;;
esac
BUNDLE="$(cd "$(dirname "$0")/.." && pwd)"
cd "$BUNDLE" || exit 2

if [ ! -x bin/weave ]; then
    echo "run-all.sh: $BUNDLE/bin/weave is missing; run this from a bundle made by \`cargo xtask gpu-bundle\`" >&2
    exit 2
fi

mkdir -p "$OUT_DIR/json" "$OUT_DIR/logs" || exit 2
rm -f "$OUT_DIR"/json/*.json "$OUT_DIR/table.md"
ATTEMPTED="$OUT_DIR/attempted.txt"
: >"$ATTEMPTED"

# NVLink multicast (NVLS) stays off; a value already set is kept.
: "${NCCL_NVLS_ENABLE:=0}"
export NCCL_NVLS_ENABLE
if [ "$NCCL_NVLS_ENABLE" != 0 ]; then
    echo "warning: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE (expected 0)" >&2
fi

echo "==> bundle: $BUNDLE"
if [ -f MANIFEST.txt ]; then
    sed -n '1,3p' MANIFEST.txt
fi
echo "==> output: $OUT_DIR"
echo "==> NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
echo "==> nvidia-smi -L"
GPU_LIST="$(timeout -k 5 30 nvidia-smi -L 2>&1)"
echo "$GPU_LIST"
GPUS="$(printf '%s\n' "$GPU_LIST" | grep -c '^GPU ')"
echo "==> $GPUS GPU(s)"

# record NAME R MODE RC [REASON]
record() {
    echo "$*" >>"$ATTEMPTED"
}

if [ "$RUN_TESTS" = 1 ] && [ -x bin/gpu-tests ]; then
    echo "==> bin/gpu-tests (WEAVE_GPU_TESTS=1, --test-threads=1)"
    WEAVE_GPU_TESTS=1 timeout -k 10 "${TEST_TIMEOUT:-300}" bin/gpu-tests --test-threads=1 \
        >"$OUT_DIR/gpu-tests.log" 2>&1
    rc=$?
    record gpu-tests - tests "$rc"
    grep -E '^test result:' "$OUT_DIR/gpu-tests.log" | sed 's/^/    /'
    echo "    rc=$rc (log: $OUT_DIR/gpu-tests.log)"
elif [ "$RUN_TESTS" = 1 ]; then
    echo "==> no bin/gpu-tests in this bundle"
fi

# run_one NAME R MODE: one scenario run, its log and its line in attempted.txt.
run_one() {
    local name="$1" r="$2" mode="$3"
    local json="$OUT_DIR/json/$name.$r.$mode.json"
    local log="$OUT_DIR/logs/$name.$r.$mode.log"
    local rc skip reason
    # The patterns whose default sizes fill the GPUs (t = h = 8192) run here at a size the
    # CPU reference computes in a moment; bin/gpu-tests runs them at full size.
    local -a extra=()
    if grep -qE '\bt = 8192' "scenarios/$name.weave"; then
        extra=(--set t=1024 --set h=512)
    fi
    echo "==> $name ranks=$r mode=$mode"
    # `-ce` modes move allgathers and send/recv with the copy engines.
    case "$mode" in
        *-ce) extra+=(--transport copy-engine) ;;
    esac
    case "$mode" in
        threads|threads-ce)
            timeout -k 10 120 bin/weave run "scenarios/$name.weave" --backend cuda \
                --ranks "$r" "${extra[@]}" --json "$json" >"$log" 2>&1
            rc=$?
            ;;
        launch|launch-ce)
            timeout -k 10 150 bin/weave launch -n "$r" --timeout-secs 120 -- \
                bin/weave run "scenarios/$name.weave" --backend cuda \
                --ranks "$r" "${extra[@]}" --json "$json" >"$log" 2>&1
            rc=$?
            ;;
        *)
            echo "    unknown mode $mode" | tee "$log"
            rc=2
            ;;
    esac
    # A run that cannot apply prints `skipped: WHY` (prefixed by `[rank R] ` when launched).
    skip="$(grep -E -m1 '^(\[rank [0-9]+\] )?skipped:' "$log")"
    if [ -n "$skip" ]; then
        reason="$(printf '%s\n' "$skip" | sed -E 's/^(\[rank [0-9]+\] )?skipped:[[:space:]]*//')"
        record "$name" "$r" "$mode" skipped "${reason:-the run skipped itself}"
        echo "    skipped: $reason"
    else
        record "$name" "$r" "$mode" "$rc"
        echo "    rc=$rc"
    fi
}

for file in scenarios/*.weave; do
    [ -f "$file" ] || continue
    name="$(basename "$file" .weave)"
    if [ -n "$ONLY" ] && ! printf ' %s ' "$ONLY" | grep -qF " $name "; then
        continue
    fi
    for r in $RANKS; do
        for mode in $MODES; do
            if [ "$r" -gt "$GPUS" ]; then
                record "$name" "$r" "$mode" skipped "needs $r GPUs, found $GPUS"
            elif [ "$name" = send_recv ] && [ "$r" != 2 ]; then
                record "$name" "$r" "$mode" skipped "fixed meshes of 2 devices"
            else
                run_one "$name" "$r" "$mode"
            fi
        done
    done
done

echo
if command -v python3 >/dev/null 2>&1; then
    timeout -k 5 60 python3 scripts/table.py "$OUT_DIR"
    exit $?
fi
echo "python3 is missing; the runs attempted (NAME RANKS MODE RC):"
cat "$ATTEMPTED"
exit 1
