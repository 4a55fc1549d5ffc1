#!/usr/bin/env bash
# tests/run.sh's output contract, on stand-in suites: stand-in cmocka
# binaries (scripts printing cmocka's lines) that pass, fail, skip with and
# without a reason, crash and hang, a check script, and result files for
# --total. Prints "ok CHECK" or "FAIL CHECK: why" per check.
set -u
unset TEST_RESULTS TEST_TOTAL TEST_FILTER TEST_VERBOSE
. "$(dirname "$0")/checkutil.sh"
# expect CHECK PATTERN: a line of $tmp/out matches the extended regex.
expect() { grep -Eq -- "$2" "$tmp/out" && ok "$1" || bad "$1" "no line matching '$2' in: $(cat "$tmp/out")"; }
absent() { grep -Eq -- "$2" "$tmp/out" && bad "$1" "a line matches '$2' in: $(cat "$tmp/out")" || ok "$1"; }

# stub NAME BODY: an executable printing cmocka-shaped lines.
stub() { printf '#!/bin/sh\n%s\n' "$2" >"$tmp/$1"; chmod +x "$tmp/$1"; }
stub passing 'printf "[ RUN      ] t_one\n[       OK ] t_one\n[ RUN      ] t_two\nnoise from t_two\n[       OK ] t_two\n[  PASSED  ] 2 test(s).\n"'
stub failing 'printf "[ RUN      ] t_bad\nwhy t_bad failed\n[  FAILED  ] t_bad\n[  FAILED  ] 1 test(s), listed below:\n[  FAILED  ] t_bad\n"; exit 1'
stub skipping 'printf "[ RUN      ] t_gpu\nSKIP: no GPU here\n[  SKIPPED ] t_gpu\n[ RUN      ] t_gpu2\nSKIP: no GPU here\n[  SKIPPED ] t_gpu2\n[ RUN      ] t_bare\n[  SKIPPED ] t_bare\n[ RUN      ] t_ok\n[       OK ] t_ok\n[  SKIPPED ] 3 test(s), listed below:\n[  SKIPPED ] t_gpu\n[  SKIPPED ] t_gpu2\n[  SKIPPED ] t_bare\n"'
stub crashing 'printf "[ RUN      ] t_one\n[       OK ] t_one\n[ RUN      ] t_two\n"; kill -SEGV $$'
stub hanging 'printf "[ RUN      ] t_slow\n"; exec sleep 30'
stub exiting 'printf "[ RUN      ] t_one\n[       OK ] t_one\n"; exit 3'
printf 'echo "ok first"\necho "SKIP second: pkg-config is missing"\necho "ok third"\n' >"$tmp/checks.sh"

TEST_TIMEOUT=1 bash "$root/tests/run.sh" "$tmp/passing" "$tmp/failing" "$tmp/skipping" "$tmp/crashing" \
  "$tmp/hanging" "$tmp/exiting" "$tmp/checks.sh" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && ok "exit 1 when a suite failed" || bad "exit 1 when a suite failed" "exit $rc"
expect "passing suite line" '^passing: 2 passed, 0 failed, 0 skipped$'
absent "passing suite output hidden" 'noise from t_two'
expect "failing suite line" '^failing: 0 passed, 1 failed, 0 skipped$'
expect "failing suite output shown" '^why t_bad failed$'
expect "skip reasons, grouped" '^skipping: 1 passed, 0 failed, 3 skipped \(skipped: t_gpu and 1 more: no GPU here; t_bare: no reason printed\)$'
expect "crash named" '^crashing: 1 passed, 1 failed, 0 skipped, crashed \(signal 11\)$'
expect "hang named" '^hanging: 0 passed, 1 failed, 0 skipped, timed out after 1 s \(TEST_TIMEOUT\)$'
expect "bad exit named" '^exiting: 1 passed, 1 failed, 0 skipped, exited with status 3$'
expect "check script counted" '^checks: 2 passed, 0 failed, 1 skipped \(skipped: second: pkg-config is missing\)$'
last=$(tail -n1 "$tmp/out")
[ "$last" = "tests: 7 passed, 4 failed, 4 skipped" ] && ok "last line is the total" ||
  bad "last line is the total" "last line: $last"

# LeakSanitizer failing at exit after every test passed: run up to twice
# more. lsanonce fails that way the first time only (a marker file),
# lsantwice the first two times (a count), lsanalways every time; leaking
# reports a real leak, which is never run again.
lsan_tail='[  PASSED  ] 1 test(s).\nTracer caught signal 11: addr=0xc0\n==1==LeakSanitizer has encountered a fatal error.\n'
stub lsanonce "printf '[ RUN      ] t_one\\n[       OK ] t_one\\n'; if [ -e '$tmp/lsan-ran' ]; then printf '[  PASSED  ] 1 test(s).\\n'; exit 0; fi; : >'$tmp/lsan-ran'; printf '$lsan_tail'; exit 1"
stub lsantwice "echo run >>'$tmp/lsan2-runs'; printf '[ RUN      ] t_one\\n[       OK ] t_one\\n'; if [ \$(wc -l <'$tmp/lsan2-runs') -ge 3 ]; then printf '[  PASSED  ] 1 test(s).\\n'; exit 0; fi; printf '$lsan_tail'; exit 1"
stub lsanalways "echo run >>'$tmp/lsan3-runs'; printf '[ RUN      ] t_one\\n[       OK ] t_one\\n$lsan_tail'; exit 1"
stub leaking "echo run >>'$tmp/leak-runs'; printf '[ RUN      ] t_one\\n[       OK ] t_one\\n[  PASSED  ] 1 test(s).\\n==1==ERROR: LeakSanitizer: detected memory leaks\\n'; exit 1"
bash "$root/tests/run.sh" "$tmp/lsanonce" "$tmp/lsantwice" "$tmp/lsanalways" "$tmp/leaking" >"$tmp/out" 2>&1
expect "sanitizer failure retried, said" '^lsanonce: LeakSanitizer itself failed at exit .*running it again$'
expect "sanitizer failure once passes" '^lsanonce: 1 passed, 0 failed, 0 skipped$'
expect "sanitizer failure twice passes on the third run" '^lsantwice: 1 passed, 0 failed, 0 skipped$'
expect "sanitizer failure three times fails" '^lsanalways: 1 passed, 1 failed, 0 skipped, exited with status 1$'
[ "$(wc -l <"$tmp/lsan3-runs")" -eq 3 ] && ok "a sanitizer failure is run three times at most" ||
  bad "a sanitizer failure is run three times at most" "$(wc -l <"$tmp/lsan3-runs") runs"
[ "$(grep -c '^lsanalways: LeakSanitizer itself failed at exit' "$tmp/out")" -eq 2 ] && ok "each rerun said" ||
  bad "each rerun said" "$(grep -c '^lsanalways: LeakSanitizer' "$tmp/out") lines"
expect "a leak fails" '^leaking: 1 passed, 1 failed, 0 skipped, exited with status 1$'
[ "$(wc -l <"$tmp/leak-runs")" -eq 1 ] && ok "a leak is not run again" || bad "a leak is not run again" "$(wc -l <"$tmp/leak-runs") runs"

TEST_FILTER=pass bash "$root/tests/run.sh" "$tmp/passing" "$tmp/failing" >"$tmp/out" 2>&1
[ $? -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq 2 ] && ok "TEST_FILTER" || bad "TEST_FILTER" "$(cat "$tmp/out")"

# Parts of make test: results files, then one total.
TEST_RESULTS=$tmp/r/a TEST_TOTAL=later bash "$root/tests/run.sh" "$tmp/failing" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && ! grep -q '^tests:' "$tmp/out" && ok "TEST_TOTAL=later defers the total" ||
  bad "TEST_TOTAL=later defers the total" "exit $rc: $(cat "$tmp/out")"
TEST_RESULTS=$tmp/r/b TEST_TOTAL=later bash "$root/tests/run.sh" "$tmp/skipping" >/dev/null 2>&1
bash "$root/tests/run.sh" --total "$tmp/r/a" "$tmp/r/b" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(tail -n1 "$tmp/out")" = "tests: 1 passed, 1 failed, 3 skipped" ] && ok "--total sums parts" ||
  bad "--total sums parts" "exit $rc: $(cat "$tmp/out")"
bash "$root/tests/run.sh" --total "$tmp/r/b" "$tmp/r/missing" >"$tmp/out" 2>&1
[ $? -eq 1 ] && expect "--total counts a missing part as failed" 'r/missing \(that part of the tests did not run\)' ||
  bad "--total counts a missing part as failed" "$(cat "$tmp/out")"
exit $failed
