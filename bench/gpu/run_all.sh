#!/usr/bin/env bash
# Every GPU check of tally in one command, for a lent GPU machine (the
# `device` tool gives one run of about ten minutes):
#
#   bash bench/gpu/run_all.sh            # results in $OUT (or build/gpu-results)
#
# 1. builds tally (library, demo, tools, benchmarks) with the cuda and async
#    backends compiled in;
# 2. runs the demo on the cuda backend;
# 3. runs bench/gpu/cuda_check.c on the cuda and on the async backend
#    (stream separation, record_stream with a busy stream, stage-end release,
#    OOM on the real device, cached pair timing);
# 4. replays the traces through tally over cuda and over async, and straight
#    through cudaMalloc and cudaMallocAsync (bench/gpu/raw_replay.c);
# 5. runs bench/gpu/torch_check.sh (PyTorch under tally vs native).
# Traces: $TALLY_TRACES, else ../shared/traces, else build/traces-shared
# (copy them there before sending the tree to a machine without shared/).
# Each step has its own time limit; the summary at the end lists failures.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build/gpu-results}
mkdir -p "$OUT"
TRACES=${TALLY_TRACES:-$ROOT/../shared/traces}
[ -d "$TRACES" ] || TRACES=$ROOT/build/traces-shared
fails=""
step() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout "$secs" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  tail -n 60 "$OUT/$name.txt"
  [ $rc -eq 0 ] || { fails="$fails $name(rc=$rc)"; echo "== $name FAILED rc=$rc"; }
}

{ date -u; uname -a; nvidia-smi -L 2>&1; nvcc --version 2>&1 | tail -1; } >"$OUT/machine.txt"
cat "$OUT/machine.txt"
step build 300 make -j"$(nproc)" all
CUDA=/usr/local/cuda
CC_CUDA="cc -std=c11 -D_GNU_SOURCE -O2 -Iinclude -isystem $CUDA/include"
LD_CUDA="-L$CUDA/lib64 -lcudart -Wl,-rpath,$CUDA/lib64 -lpthread -ldl -lm"
step build-gpu 120 bash -c "$CC_CUDA -o build/bin/cuda_check bench/gpu/cuda_check.c build/lib/libtally.a $LD_CUDA &&
  $CC_CUDA -o build/bin/raw_replay bench/gpu/raw_replay.c bench/trace.c $LD_CUDA &&
  make -C bench BUILD=$ROOT/build $ROOT/build/bin/tally-replay >/dev/null"
step demo-cuda 60 env TALLY_CONF=backend:cuda build/bin/demo
step check-cuda 60 env TALLY_CONF=backend:cuda build/bin/cuda_check cuda
step check-async 60 env TALLY_CONF=backend:async build/bin/cuda_check async
# The cmocka GPU tests (need libcmocka-dev on the machine; reported, not fatal to the rest).
step tests-cuda 180 bash -c "make build/tests/test_cuda >/dev/null && build/tests/test_cuda"
if [ -d "$TRACES" ]; then
  step replay-tally-cuda 120 build/bin/tally-replay --conf backend:cuda "$TRACES"
  step replay-tally-async 120 build/bin/tally-replay --conf backend:async "$TRACES"
  step replay-raw-malloc 120 build/bin/raw_replay malloc "$TRACES"/*.csv
  step replay-raw-async 120 build/bin/raw_replay async "$TRACES"/*.csv
else
  echo "no traces at $TRACES: replays skipped"; fails="$fails traces-missing"
fi
step torch 300 bash bench/gpu/torch_check.sh
echo "== summary: ${fails:-all steps passed}"
[ -z "$fails" ]
