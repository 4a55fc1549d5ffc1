#!/usr/bin/env bash
# Every GPU check of tally in one command, for any lent GPU machine (under
# 540 s in all; no apt-get, no network):
#
#   bash bench/gpu/run_all.sh              # results in $OUT when set
#   bash bench/gpu/run_all.sh --dry-run    # anywhere: say what would run, exit 0
#
# Every check prints one line, PASS / FAIL / SKIP with its figures; the
# summary (those lines) goes to $OUT/summary.txt when OUT is set, each step's
# log to $OUT/<step>.txt. In order, each within what is left of the budget:
#  1. build tally (make all);
#  2. make test with TALLY_REAL_CUDA=1: the C cuda / async tests against the
#     real driver instead of the CUDA stand-in;
#  3. the PyTorch checks of bench/gpu/torch_checks.py, one process each: no
#     primary context on other devices, cudaGetLastError clean after a failing
#     tally operation, torch.cuda.graph capture of a small model replayed 100
#     times with outputs equal to eager (default and async backends), a convolution near
#     the memory limit falling back (c10::OutOfMemoryError shim), a training
#     loop's speed and peak reserved under tally and under PyTorch's allocator;
#  4. if time is left: bench/gpu/torch_check.sh (the longer PyTorch workload),
#     and trace replays when traces were copied into the tree
#     ($TALLY_TRACES, else build/traces-shared).
# Without an NVIDIA GPU (or with --dry-run) every step is a SKIP and the exit
# status is 0. Otherwise it is 1 when any check failed.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUDGET=${TALLY_GPU_BUDGET:-540}
PYTHON=${PYTHON:-python3}
T0=$SECONDS
LOGS=${OUT:-$ROOT/build/gpu-results}
mkdir -p "$LOGS"
SUMMARY=$(mktemp "${TMPDIR:-/tmp}/tally-gpu-summary.XXXXXX")
fails=0

line() { # status name text
  echo "$1 $2: $3" | tee -a "$SUMMARY"
  [ "$1" = FAIL ] && fails=$((fails + 1))
  return 0
}
left() { echo $((BUDGET - (SECONDS - T0))); }
finish() {
  if [ -n "${OUT:-}" ]; then
    { echo "tally GPU checks, $(date -u +%FT%TZ), $((SECONDS - T0)) s"; cat "$SUMMARY"; } >"$OUT/summary.txt"
  fi
  echo "== $(grep -c '^PASS' "$SUMMARY") passed, $(grep -c '^FAIL' "$SUMMARY") failed, $(grep -c '^SKIP' "$SUMMARY") skipped in $((SECONDS - T0)) s"
  rm -f "$SUMMARY"
  [ "$fails" -eq 0 ]
  exit $?
}
# step NAME SECONDS COMMAND...: PASS / FAIL by exit status, log in $LOGS.
step() {
  local name=$1 want=$2; shift 2
  local budget
  budget=$(left)
  [ "$budget" -gt "$want" ] && budget=$want
  if [ "$budget" -lt 20 ]; then line SKIP "$name" "out of time ($(left) s left of $BUDGET)"; return 1; fi
  local t=$SECONDS
  timeout "$budget" "$@" >"$LOGS/$name.txt" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    local counts
    counts=$(grep -E '^tests: ' "$LOGS/$name.txt" | tail -n 1)
    line PASS "$name" "$((SECONDS - t)) s${counts:+, $counts}"
  else
    tail -n 30 "$LOGS/$name.txt"
    line FAIL "$name" "rc=$rc after $((SECONDS - t)) s$([ $rc -eq 124 ] && echo " (timed out)"); log $LOGS/$name.txt"
  fi
  return $rc
}
# torch_check NAME ARGS...: one line of bench/gpu/torch_checks.py.
torch_check() {
  local name=$1; shift
  if [ "$(left)" -lt 30 ]; then line SKIP "$name" "out of time"; return; fi
  local out
  out=$(timeout $(( $(left) < 150 ? $(left) : 150 )) "$PYTHON" bench/gpu/torch_checks.py "$@" 2>"$LOGS/$name.err")
  local rc=$?
  local result
  result=$(printf '%s\n' "$out" | grep -E '^(PASS|FAIL|SKIP) ' | tail -n 1)
  if [ -n "$result" ]; then
    echo "$result" | tee -a "$SUMMARY"
    case $result in FAIL*) fails=$((fails + 1)); tail -n 15 "$LOGS/$name.err";; esac
  else
    tail -n 15 "$LOGS/$name.err"
    line FAIL "$name" "no result line (rc=$rc); log $LOGS/$name.err"
  fi
}

STEPS="build make-test contexts last_error graph graph-async conv train-tally train-native ipc ipc-expandable empty-cache torch-workload"
gpu=""
if [ "${1:-}" != "--dry-run" ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)
fi
if [ -z "$gpu" ]; then
  why="no NVIDIA GPU on this machine (nvidia-smi absent or lists none)"
  [ "${1:-}" = "--dry-run" ] && why="dry run"
  line SKIP gpu "$why"
  for s in $STEPS; do line SKIP "$s" "$why"; done
  finish
fi

{ date -u; uname -m; echo "$gpu"; nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>&1
  command -v nvcc >/dev/null && nvcc --version | tail -1
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1; } | tee "$LOGS/machine.txt"

step build 240 make -j"$(nproc)" all || finish
# make test's first run calls tools/setup.sh, which would apt-get what the
# benchmarks and fuzzing need: here only cmocka matters, and nothing is
# installed (no network on a lent machine).
if [ -f /usr/include/cmocka.h ]; then
  mkdir -p build && touch build/.setup-ok
  step make-test 200 env TALLY_REAL_CUDA=1 make -j"$(nproc)" test
else
  line SKIP make-test "libcmocka-dev is not installed (run_all.sh installs nothing)"
fi
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  export TALLY_LIB=$ROOT/build/lib/libtally.so
  torch_check contexts contexts
  torch_check last_error last_error
  torch_check graph graph
  torch_check graph-async graph --async
  torch_check conv conv
  torch_check train-tally train
  torch_check train-native train --native
  torch_check ipc ipc
  torch_check ipc-expandable ipc --expandable
  torch_check empty-cache empty-cache
  if [ "$(left)" -gt 200 ]; then
    step torch-workload 180 env TALLY_CHECK_STEPS=150 bash bench/gpu/torch_check.sh
  else
    line SKIP torch-workload "not enough time left ($(left) s)"
  fi
else
  for s in contexts last_error graph graph-async conv train-tally train-native ipc ipc-expandable empty-cache torch-workload; do
    line SKIP "$s" "PyTorch with CUDA is not importable by $PYTHON"
  done
fi
TRACES=${TALLY_TRACES:-$ROOT/build/traces-shared}
if [ -d "$TRACES" ] && [ "$(left)" -gt 120 ]; then
  step replay-build 60 make -C bench BUILD="$ROOT/build" "$ROOT/build/bin/tally-replay" &&
    step replay 90 build/bin/tally-replay "$TRACES"
else
  line SKIP replay "no traces at $TRACES (copy them into the tree) or not enough time"
fi
finish
