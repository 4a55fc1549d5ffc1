#!/usr/bin/env bash
# Replays every seed (tests/fuzz/corpus/<target>/) and regression input
# (tests/fuzz/regressions/<target>/) through each target built without
# libFuzzer (tests/fuzz/replay_main.c). Usage: replay.sh BINDIR TARGET...
# One line per target; exit 1 if any target crashed or failed a check.
set -u
bindir=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
failed=""
for t in "$@"; do
  out=$("$bindir/$t" "$here/corpus/$t" "$here/regressions/$t" 2>&1); rc=$?
  if [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -n 40
    echo "fuzz-replay: $t FAILED (exit $rc); rerun with REPLAY_VERBOSE=1 to see which input"
    failed="$failed $t"
  else
    echo "fuzz-replay: $t: $(printf '%s\n' "$out" | tail -n1)"
  fi
done
[ -z "$failed" ]
