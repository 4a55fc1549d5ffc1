#!/usr/bin/env bash
# tests/fuzz/replay.sh on stand-in targets: a hanging target is stopped after
# REPLAY_TIMEOUT and named, the targets after it still run, and the replay
# fails; a passing and a failing target are reported as before. Prints
# "ok CHECK" or "FAIL CHECK: why" per check.
set -u
. "$(dirname "$0")/checkutil.sh"
expect() { grep -Eq -- "$2" "$tmp/out" && ok "$1" || bad "$1" "no line matching '$2' in: $(cat "$tmp/out")"; }

# stub NAME BODY: a stand-in replay binary (called with two folders).
mkdir -p "$tmp/bin"
stub() { printf '#!/bin/sh\n%s\n' "$2" >"$tmp/bin/$1"; chmod +x "$tmp/bin/$1"; }
stub fuzz_fine 'echo "replayed 3 inputs"'
stub fuzz_hangs 'echo "input 1"; exec sleep 60'
stub fuzz_breaks 'echo "check failed"; exit 3'

start=$(date +%s)
REPLAY_TIMEOUT=2 bash "$root/tests/fuzz/replay.sh" "$tmp/bin" fuzz_hangs fuzz_fine fuzz_breaks >"$tmp/out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
[ $rc -eq 1 ] && ok "exit 1 when a target hung" || bad "exit 1 when a target hung" "exit $rc"
[ "$took" -lt 20 ] && ok "hanging target stopped" || bad "hanging target stopped" "the replay took $took s"
expect "hanging target named" '^fuzz-replay: fuzz_hangs TIMED OUT after 2 s \(REPLAY_TIMEOUT\)'
expect "targets after it still run" '^fuzz-replay: fuzz_fine: replayed 3 inputs$'
expect "failing target named" '^fuzz-replay: fuzz_breaks FAILED \(exit 3\)'

REPLAY_TIMEOUT=2 bash "$root/tests/fuzz/replay.sh" "$tmp/bin" fuzz_fine >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "exit 0 when every target passed" || bad "exit 0 when every target passed" "exit $rc: $(cat "$tmp/out")"
exit $failed
