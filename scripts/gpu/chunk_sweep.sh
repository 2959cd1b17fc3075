#!/usr/bin/env bash
# Runs every scenario of a bundle on one GPU with every chunk count 1..6 (the CUDA side of
# tests/scenario_sweep.rs), plus uneven chunks at sizes that fill the GPU a little:
#
#   bash scripts/chunk_sweep.sh [OUT_DIR]
#
# Scenarios with mesh sizes `d`, `dy`, `dx` run with them at 1 (one rank), the benchmark
# patterns with small uneven sizes (t = 10, h = 3); scenarios whose meshes name other devices
# are skipped. A run passes when `weave run` checks it against the reference; a run refused at
# load (exit status 1 with a `-->` file:line:col) counts as refused. Writes
# OUT_DIR/sweep.txt (`NAME s RESULT`), logs/ and prints a summary last.
set -u
OUT_DIR="${1:-${OUT:-./out}}"
mkdir -p "$OUT_DIR/logs"
BUNDLE="$(cd "$(dirname "$0")/.." && pwd)"
cd "$BUNDLE" || exit 2
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
: > "$OUT_DIR/sweep.txt"
pass=0; fail=0; refused=0
run() { # NAME TAG ARGS...
    local name="$1" tag="$2"; shift 2
    local log="$OUT_DIR/logs/$name.$tag.log"
    timeout 120 bin/weave run "scenarios/$name.weave" --backend cuda --ranks 1 --timeout-secs 60 "$@" > "$log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then res=pass; pass=$((pass + 1));
    elif grep -q -- '-->' "$log" && ! grep -q 'host program:' "$log"; then res=refused; refused=$((refused + 1));
    else res="FAIL(rc=$rc)"; fail=$((fail + 1)); fi
    echo "$name $tag $res" >> "$OUT_DIR/sweep.txt"
}
for f in scenarios/*.weave; do
    name="$(basename "$f" .weave)"
    header="$(grep -m1 '^fusion' "$f")"
    # Explicit meshes that name devices other than 0 need more than one GPU.
    if grep -Eq '^ *mesh [a-z_0-9]+ = \[[^]]*[1-9]' "$f"; then continue; fi
    has() { echo "$header" | grep -Eq "[(, ]$1 ="; }
    base=()
    if has d; then base+=(--set d=1); fi
    if has dy; then base+=(--set dy=1); fi
    if has dx; then base+=(--set dx=1); fi
    if echo "$header" | grep -q '8192'; then base+=(--set t=10 --set h=3); fi
    if has s; then
        for s in 1 2 3 4 5 6; do run "$name" "s$s" "${base[@]}" --set "s=$s"; done
    else
        run "$name" "s-" "${base[@]}"
    fi
done
# Uneven chunks at larger sizes: short last chunks through slots, GEMMs and kernels.
run row_parallel_linear big-s3 --set d=1 --set t=1000 --set h=256 --set s=3 --warmup 1
run row_parallel_linear big-s7 --set d=1 --set t=4097 --set h=512 --set s=7 --warmup 1
run matmul_rs big-s5 --set d=1 --set t=2003 --set h=256 --set s=5 --warmup 1
run single_set_op big-s6 --set x=100003 --set y=64 --set s=6
echo "pass $pass refused $refused fail $fail"
grep -v ' pass$' "$OUT_DIR/sweep.txt" | head -40
