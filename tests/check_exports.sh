#!/usr/bin/env bash
# The shared library exports only tally_* symbols, every exported function
# is declared in include/tally.h, and it depends on no CUDA library (the
# CUDA driver is opened with dlopen at run time: lib/backend/cuda/loader.c),
# and it needs no static TLS (an initial-exec thread-local makes the whole
# thread-local block static, and a dlopen into a process whose static TLS is
# used up, as PyTorch's loading of a pluggable allocator is, then fails).
set -u
so=${1:-build/lib/libtally.so}
syms=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort -u)
bad=$(printf '%s\n' "$syms" | grep -v '^tally_' || true)
undoc=""
for s in $syms; do
  case "$s" in tally_*) grep -q "\b$s(" include/tally.h || undoc="$undoc $s";; esac
done
cudadep=$(readelf -d "$so" | grep NEEDED | grep -Ei 'cuda|nvidia' || true)
static_tls=$(readelf -d "$so" | grep -E 'FLAGS.*STATIC_TLS' || true)
if [ -n "$bad" ] || [ -n "$undoc" ] || [ -n "$cudadep" ] || [ -n "$static_tls" ]; then
  [ -n "$static_tls" ] && echo "exports: $so needs static TLS (an initial-exec thread-local): $static_tls"
  [ -n "$cudadep" ] && echo "exports: $so links a CUDA library: $cudadep"
  [ -n "$bad" ] && echo "exports: symbols outside tally_*: $bad"
  [ -n "$undoc" ] && echo "exports: not declared in include/tally.h:$undoc"
  echo "exports: FAILED"; exit 1
fi
echo "exports: $(printf '%s\n' "$syms" | wc -l) symbols, all tally_* and declared in include/tally.h"
