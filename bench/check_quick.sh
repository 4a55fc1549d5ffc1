#!/usr/bin/env bash
# make bench-quick: bench/run.sh --quick, then a check that every program
# ran and its table is in the report (a heading and at least one row with a
# figure under it). It checks that the benchmarks run, not their figures.
#   bash bench/check_quick.sh <build dir>
set -uo pipefail
BUILD=${1:?usage: bash bench/check_quick.sh <build dir>}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
report=$BUILD/bench-quick.md
t0=$SECONDS
if ! bash "$HERE/run.sh" --quick "$BUILD" >"$report" 2>"$report.err"; then
  cat "$report.err" >&2
  echo "bench-quick: bench/run.sh --quick failed (report so far: $report)" >&2
  exit 1
fi
failed=0
# section HEADING PROGRAM: under the heading (up to the next one), a table
# row holding a number.
section() {
  if awk -v h="$1" 'index($0, h) == 1 { on = 1; next } /^##/ { on = 0 }
       on && /^\|/ && !/^\|---/ && /[0-9]/ && !/^\| *(sizes|pattern|trace|sites|python_stack|expandable_)/ { found = 1 }
       on && /^T [a-z]+ .*[0-9]/ { found = 1 }
       END { exit !found }' "$report"; then
    echo "bench-quick: ok $2"
  else
    echo "bench-quick: FAIL $2: no table with figures under '$1' in $report" >&2
    failed=1
  fi
}
section "## Hot path: CPU ns per allocate+free pair" "hotpath-glibc, hotpath-jemalloc, hotpath-mimalloc"
section "## Hot path: tally ledger on / off" "hotpath-glibc ledger on / off, backtrace_depth:16"
section "## Allocation sites: unwinding" "unwind"
section "## Allocation sites: python_stack:8" "pystack.py"
section "## Replay (PyTorch" "tally-replay"
section "## Replay with expandable_segments" "tally-replay (expandable segments)"
section "### PyTorch's placement (default)" "tally-driver-cost"
section "### expandable_segments:true" "tally-driver-cost (expandable segments)"
section "## Expandable segments: memory" "pt-expand-model"
section "### RAPIDS RMM's pool_memory_resource" "rmm-pool-model"
section "### expandable_grow_chunk_mb" "tally-replay expandable_grow_chunk_mb"
section "### expandable_handle_mb" "tally-replay expandable_handle_mb"
section "## Hot path through PyTorch" "torchpath-mimalloc"
section "## Threads taking turns on one device" "turns"
section "## tally tune" "tune.sh (gen_trace, tally tune, hotpath trace:true)"
# pair-ab on two copies of one build: both lines, the first at 1 against itself.
ab_dir=$(mktemp -d)
cp "$BUILD/lib/libtally.so" "$ab_dir/a.so" && cp "$BUILD/lib/libtally.so" "$ab_dir/b.so"
if "$BUILD/bench/pair-ab" --reps 5 --batches 20 "$ab_dir/a.so" "$ab_dir/b.so" >"$ab_dir/out" 2>&1 &&
  [ "$(grep -c '^AB .* mimalloc [0-9.]* first [0-9.]* q1 [0-9.]* q3 [0-9.]*$' "$ab_dir/out")" = 2 ] &&
  grep -q "^AB $ab_dir/a.so mimalloc [0-9.]* first 1.0000 " "$ab_dir/out"; then
  echo "bench-quick: ok pair-ab"
else
  cat "$ab_dir/out" >&2
  echo "bench-quick: FAIL pair-ab: two AB lines, the first at 1.0000, expected" >&2; failed=1
fi
# Each library is opened from its own copy in memory: one named twice runs
# twice (the noise floor); a file that is not there is named.
if "$BUILD/bench/pair-ab" --reps 5 --batches 20 "$ab_dir/a.so" "$ab_dir/a.so" >"$ab_dir/out" 2>&1 &&
  [ "$(grep -c "^AB $ab_dir/a.so mimalloc" "$ab_dir/out")" = 2 ]; then
  echo "bench-quick: ok pair-ab, one library twice"
else
  cat "$ab_dir/out" >&2
  echo "bench-quick: FAIL pair-ab: one library named twice must run twice" >&2; failed=1
fi
if "$BUILD/bench/pair-ab" "$ab_dir/none.so" "$ab_dir/a.so" >"$ab_dir/out" 2>&1 ||
  ! grep -q "^pair-ab: $ab_dir/none.so: No such file or directory$" "$ab_dir/out"; then
  cat "$ab_dir/out" >&2
  echo "bench-quick: FAIL pair-ab: a library that is not there must be named" >&2; failed=1
fi
rm -rf "$ab_dir"
# Every jemalloc / mimalloc column holds a figure (the binaries really ran).
if awk -F'|' '/^\| <= 256 KiB \| pair \| 1 \|/ { if ($5 ~ /[0-9]/ && $6 ~ /[0-9]/ && $7 ~ /[0-9]/) ok = 1 } END { exit !ok }' "$report"; then
  echo "bench-quick: ok glibc, jemalloc and mimalloc figures"
else
  echo "bench-quick: FAIL the hot path table lacks a glibc, jemalloc or mimalloc figure" >&2; failed=1
fi
echo "bench-quick: $([ $failed = 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s (report: $report)"
exit $failed
