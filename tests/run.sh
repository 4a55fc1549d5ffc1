#!/usr/bin/env bash
# Runs test suites, prints one summary line per suite, and ends with the
# total. A suite is
#   a cmocka test binary        counted from cmocka's [  PASSED  ] /
#                               [  FAILED  ] / [  SKIPPED ] lines; a test that
#                               skips prints "SKIP: why" first (tests/skip.h)
#   a check script, NAME.sh     each line "ok CHECK", "FAIL CHECK: why" or
#                               "SKIP CHECK: why" counts one
#   py:DIR                      each DIR/test_*.py module with Python's
#                               unittest (-v), one suite per module
# Output contract (CI reads it):
#   - per suite, one line: "NAME: N passed, N failed, N skipped", then, when
#     something was skipped, " (skipped: TEST: why; ...)"; a suite that
#     failed, crashed or timed out has its whole output printed above that
#     line, and the line says "crashed (signal N)", "exited with status N"
#     (outside any test) or "timed out after N s (TEST_TIMEOUT)";
#     a passing suite's output is not shown (TEST_VERBOSE=1 shows it);
#   - the last line: "tests: N passed, N failed, N skipped" over all suites.
# Exit 1 if anything failed.
# Environment: TEST_FILTER=summary runs only suites whose name contains it;
# TEST_TIMEOUT (seconds, default 900) bounds each suite; TEST_RESULTS=FILE
# also writes "passed failed skipped" there and, with TEST_TOTAL=later,
# leaves the total line and the exit status to `tests/run.sh --total FILE...`
# (so `make test` ends with one total over its parts).
#   tests/run.sh --total FILE...   prints the total of result files.
set -u
passed=0 failed=0 skipped=0

# Under ASan, LeakSanitizer's exit check crashed ("Tracer caught signal 11",
# "LeakSanitizer has encountered a fatal error") in 17 of 20 runs of
# test_ledger_sites on 2026-12-03: with log_threads=1 the main thread showed
# a dynamic TLS range of 0xbb-0x4000011bd, which its tracer then read.
# ASan's __tls_get_addr interceptor records those ranges for dlopen'ed
# libraries' TLS blocks (libunwind, libdw and libelf: dlopen'ed to unwind
# and to symbolise), working out each block's size from the memory around
# it, and here that came out wrong. intercept_tls_get_addr=0 stops
# the recording (0 crashes in 20 runs). A pointer that only a dlopen'ed
# library's TLS holds is then not a root, which can only add a false leak,
# never hide one. What ASAN_OPTIONS already holds is kept and comes later,
# so it wins.
export ASAN_OPTIONS="intercept_tls_get_addr=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
timeout_s=${TEST_TIMEOUT:-900}

total_line() {
  echo "tests: $passed passed, $failed failed, $skipped skipped"
}

if [ "${1:-}" = --total ]; then
  shift
  for f in "$@"; do
    if [ ! -r "$f" ]; then
      echo "run.sh: no results in $f (that part of the tests did not run)"
      failed=$((failed + 1))
      continue
    fi
    read -r p f_ s <"$f"
    passed=$((passed + p)); failed=$((failed + f_)); skipped=$((skipped + s))
  done
  total_line
  [ "$failed" -eq 0 ]
  exit
fi

out=$(mktemp "${TMPDIR:-/tmp}/tally-test-XXXXXX")
trap 'rm -f "$out"' EXIT

# run NAME CMD...: runs CMD under the timeout into $out; sets rc and note.
run() {
  local name=$1; shift
  env -u TEST_RESULTS -u TEST_TOTAL timeout -k 10 "$timeout_s" "$@" >"$out" 2>&1
  rc=$?
  note=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note="timed out after $timeout_s s (TEST_TIMEOUT)"
  fi
}

# report NAME P F S SKIPS: the suite's line; its output first when it failed.
report() {
  local name=$1 p=$2 f=$3 s=$4 skips=$5
  if [ -z "$note" ] && [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    if [ $rc -gt 128 ]; then note="crashed (signal $((rc - 128)))"; else note="exited with status $rc"; fi
  fi
  [ -n "$note" ] && f=$((f + 1))
  if [ "$f" -ne 0 ] || [ -n "${TEST_VERBOSE:-}" ]; then
    echo "---- $name: output"
    cat "$out"
    echo "---- $name: end of output"
  fi
  local line="$name: $p passed, $f failed, $s skipped"
  [ -n "$note" ] && line="$line, $note"
  [ -n "$skips" ] && line="$line (skipped: $skips)"
  echo "$line"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

# LeakSanitizer's own failure at exit ("LeakSanitizer has encountered a
# fatal error", its stop-the-world tracer crashing: an intermittent defect
# of the sanitizer, google/sanitizers#1353, not a leak, which it reports as
# "detected memory leaks") after every test of the binary passed.
lsan_broke() {
  [ $rc -ne 0 ] && grep -q 'LeakSanitizer has encountered a fatal error' "$out" &&
    ! grep -q 'detected memory leaks' "$out" && ! grep -q '^\[  FAILED  \]' "$out"
}

cmocka_suite() {
  local t=$1 name
  name=$(basename "$t")
  run "$name" "$t"
  # Up to twice more, saying so each time: a third failure counts as any other.
  local tries=1
  while lsan_broke && [ $tries -lt 3 ]; do
    echo "$name: LeakSanitizer itself failed at exit (google/sanitizers#1353); running it again"
    run "$name" "$t"
    tries=$((tries + 1))
  done
  # Per test: its SKIP reason (printed between its RUN and SKIPPED lines).
  local counts
  counts=$(awk '
    /^\[ RUN      \] / { cur = $4 }
    /^SKIP: / { why[cur] = substr($0, 7) }
    /^\[  SKIPPED \] [0-9]+ test/ { next }
    /^\[  SKIPPED \] / { if (!($4 in seen)) { seen[$4] = 1; s++
        r = $4 in why ? why[$4] : "no reason printed"
        if (!(r in first)) { first[r] = $4; order[++nr] = r }
        same[r]++ } }
    /^\[       OK \] / { p++ }
    /^\[  FAILED  \] [0-9]+ test/ { next }
    /^\[  FAILED  \] / { if (!($4 in failedt)) { failedt[$4] = 1; f++ } }
    END { for (i = 1; i <= nr; i++) { r = order[i]
            skips = skips (skips ? "; " : "") first[r] (same[r] > 1 ? " and " same[r] - 1 " more" : "") ": " r }
          printf "%d %d %d %s\n", p, f, s, skips }' "$out")
  local p f s skips
  read -r p f s skips <<<"$counts"
  report "$name" "$p" "$f" "$s" "$skips"
}

script_suite() {
  local t=$1 name
  name=$(basename "$t" .sh)
  run "$name" bash "$t"
  local p f s skips
  p=$(grep -c '^ok ' "$out")
  f=$(grep -c '^FAIL ' "$out")
  s=$(grep -c '^SKIP ' "$out")
  skips=$(sed -n 's/^SKIP //p' "$out" | paste -sd';' - | sed 's/;/; /g')
  report "$name" "$p" "$f" "$s" "$skips"
}

python_suites() {
  local dir=$1 mod name
  if ! command -v python3 >/dev/null 2>&1; then
    rc=0 note=""
    : >"$out"
    report python 0 0 1 "all: python3 is not installed"
    return
  fi
  for mod in "$dir"/test_*.py; do
    name=python/$(basename "$mod" .py)
    if [ -n "${TEST_FILTER:-}" ] && [[ "$name" != *"$TEST_FILTER"* ]]; then continue; fi
    run "$name" python3 -m unittest discover -v -s "$dir" -t "$(dirname "$dir")" -p "$(basename "$mod")"
    local counts
    counts=$(awk '
      / \.\.\. skipped / { n = $1; sub(/^.* \.\.\. skipped /, ""); gsub(/^'\''|'\''$/, "")
                           skips = skips (skips ? "; " : "") n ": " $0 }
      /^Ran [0-9]+ test/ { ran = $2 }
      /^FAILED \(|^OK \(/ { line = $0; gsub(/[(),]/, " ", line); k = split(line, w, " ")
                            for (i = 1; i <= k; i++) { split(w[i], kv, "=")
                              if (kv[1] == "failures" || kv[1] == "errors") f += kv[2]
                              if (kv[1] == "skipped") s += kv[2] } }
      END { printf "%d %d %d %s\n", ran - f - s, f, s, skips }' "$out")
    local p f s skips
    read -r p f s skips <<<"$counts"
    report "$name" "$p" "$f" "$s" "$skips"
  done
}

for t in "$@"; do
  case $t in
    py:*) python_suites "${t#py:}"; continue ;;
  esac
  name=$(basename "$t" .sh)
  if [ -n "${TEST_FILTER:-}" ] && [[ "$name" != *"$TEST_FILTER"* ]]; then continue; fi
  case $t in
    *.sh) script_suite "$t" ;;
    *) cmocka_suite "$t" ;;
  esac
done

if [ -n "${TEST_RESULTS:-}" ]; then
  mkdir -p "$(dirname "$TEST_RESULTS")"
  echo "$passed $failed $skipped" >"$TEST_RESULTS"
  [ "${TEST_TOTAL:-}" = later ] && exit 0
fi
total_line
[ "$failed" -eq 0 ]
