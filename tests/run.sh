#!/usr/bin/env bash
# Runs each cmocka test binary given, shows its output, and ends with one line
# "N passed, N failed, N skipped" summed over all of them. Exit 1 if any failed.
set -u
passed=0 failed=0 skipped=0 broken=""
for t in "$@"; do
  name=$(basename "$t")
  if [ -n "${TEST_FILTER:-}" ] && [[ "$name" != *"$TEST_FILTER"* ]]; then continue; fi
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out"
  p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
  f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -n1)
  s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -n1)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
  if [ $rc -ne 0 ] && [ -z "$f" ]; then broken="$broken $name(rc=$rc)"; failed=$((failed + 1)); fi
done
[ -n "$broken" ] && echo "crashed or failed outside cmocka:$broken"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
