#!/usr/bin/env bash
# Replays every seed (tests/fuzz/corpus/<target>/) and regression input
# (tests/fuzz/regressions/<target>/) through each target built without
# libFuzzer (tests/fuzz/replay_main.c). Usage: replay.sh BINDIR TARGET...
# One line per target; exit 1 if any target crashed, failed a check or ran
# past REPLAY_TIMEOUT seconds (default 300: a whole corpus takes seconds,
# and a deadlocked target must not hold the test run). A target that ran
# too long is stopped (TERM, then KILL 5 s later) and named; the others
# still run.
set -u
bindir=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
limit=${REPLAY_TIMEOUT:-300}
failed=""
for t in "$@"; do
  out=$(timeout -k 5 "$limit" "$bindir/$t" "$here/corpus/$t" "$here/regressions/$t" 2>&1); rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    printf '%s\n' "$out" | tail -n 20
    echo "fuzz-replay: $t TIMED OUT after $limit s (REPLAY_TIMEOUT), stopped; rerun with REPLAY_VERBOSE=1 to see which input"
    failed="$failed $t"
  elif [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -n 40
    echo "fuzz-replay: $t FAILED (exit $rc); rerun with REPLAY_VERBOSE=1 to see which input"
    failed="$failed $t"
  else
    echo "fuzz-replay: $t: $(printf '%s\n' "$out" | tail -n1)"
  fi
done
[ -z "$failed" ]
