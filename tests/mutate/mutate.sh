#!/usr/bin/env bash
# make mutate: one-line mutation testing.
#
# Two sets of mutations, each applied alone to a scratch copy of the tree:
#   - the list, tests/mutate/mutations.txt (tab-separated: file, a fragment
#     of one original line, its replacement, the behaviour the change breaks,
#     and optionally "equivalent: why" for a mutation shown to behave the
#     same), written by hand;
#   - the blind sample: MUTATE_BLIND (default 60) mutations generated
#     mechanically from lib/, tools/ and python/ by tests/mutate/blind.py
#     with seed MUTATE_SEED (default: drawn from the clock, and printed),
#     never chosen by looking at the tests.
# Each mutant is built into its own build directory (a copy of a pristine
# build, so only the mutated file and what links it are rebuilt), and the
# suites make test runs are run: every C and C++ test binary, the fuzz
# corpus replay, each Python test module and each check script; first those
# that cover the file (tests/mutate/coverage.txt; for a Python file the
# Python suites), then the rest, stopping at the first failure. A mutation
# that fails a suite is killed; one that passes every suite survives. A
# suite that runs past MUTATE_TIMEOUT seconds (default 120) is stopped and
# counts as "killed (timeout)". A mutation that does not build (or, in
# Python, compile) is "stillborn": left out of the score, never counted as
# killed. A listed entry whose fragment is not found, or is found more than
# once, is reported as a stale mutation and left out of the score. A listed
# entry marked equivalent that survives is left out of the score too and
# listed with its reason; one that is killed is counted, and flagged so the
# mark can go. The run ends with both scores and the survivors, one line
# each.
#
#   bash tests/mutate/mutate.sh [REGEX]   only list entries whose file and
#                                         description match REGEX (bash =~;
#                                         also MUTATE_ONLY=REGEX, as make passes it)
# A blind mutant of a C file whose object code (compiled alone at -O2, no
# debug information) is byte for byte that of the original is "equivalent
# (same object code)", found mechanically (trivial compiler equivalence) and
# left out of the score without running a test. A blind survivor that
# tests/mutate/equivalent.txt names (file, original line, mutated line, the
# reason; leading blanks not compared) is reported with its reason and left
# out of the second blind score; the first counts it. MUTATE_SCREEN=1 is a
# quicker screen, not a score: each mutant meets only the suites coverage.txt
# names for its file (the Python suites for a Python file) and "survives the
# screen" when they pass; MUTATE_BLIND_FILE=TSV takes the blind mutants from
# a file in blind.py's format instead of drawing them. With MUTATE_SANITIZE=1
# (the default), a blind survivor in a C file gets a second look, as CI's
# make asan and make ubsan would give it: built once more with AddressSanitizer
# and UndefinedBehaviorSanitizer (-O1, leak checking off), it meets the C test
# binaries coverage.txt names for its file (each first checked to pass on the
# unmodified tree so built); one that fails is "killed under ASan/UBSan".
# Environment: MUTATE_LIST (the list), MUTATE_LISTED=0 skips the list,
# MUTATE_BLIND (0: no blind sample), MUTATE_SEED, MUTATE_BLIND_GOAL (percent,
# default 90), MUTATE_TIMEOUT, MUTATE_KEEP=1 keeps the scratch directory,
# MUTATE_JOBS (make -j, default 2), MUTATE_CHECK=1 only checks that every
# entry applies and prints the blind draw (no build, no tests). Exit status
# 0 when every scored listed mutation was killed, none is stale and the blind
# score reached MUTATE_BLIND_GOAL.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
list=${MUTATE_LIST:-$root/tests/mutate/mutations.txt}
coverage=$root/tests/mutate/coverage.txt
limit=${MUTATE_TIMEOUT:-120}
jobs=${MUTATE_JOBS:-2}
pattern=${1:-${MUTATE_ONLY:-}}
listed=${MUTATE_LISTED:-1}
blind=${MUTATE_BLIND:-60}
seed=${MUTATE_SEED:-$(( $(date +%s) % 100000 ))}
goal=${MUTATE_BLIND_GOAL:-90}
screen=${MUTATE_SCREEN:-0}
blind_file=${MUTATE_BLIND_FILE:-}
equivalent_list=${MUTATE_EQUIVALENT:-$root/tests/mutate/equivalent.txt}
sanitize=${MUTATE_SANITIZE:-1}
san_flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

# The shared traces sit beside the repository (../shared/traces), not
# beside the scratch tree: without this the suites that replay them (the
# placement and goal checks of issue 21) would skip under every mutant.
if [ -z "${TALLY_TRACES:-}" ] && [ -d "$root/../shared/traces" ]; then
    export TALLY_TRACES=$(cd "$root/../shared/traces" && pwd)
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/tally-mutate.XXXXXX")
cleanup() { [ "${MUTATE_KEEP:-0}" = 1 ] || rm -rf "$scratch"; }
trap cleanup EXIT
src=$scratch/src
mkdir -p "$src"

# The scratch tree: every tracked and untracked-but-not-ignored file as it
# is now (uncommitted edits included); the working tree is never touched.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$root" && xargs -0 cp -p --parents -t "$src" 2>/dev/null)
# A clean copy of those files: before each mutant the tree is restored from
# it, so a mutant that writes over a test's input (a tune mutant whose
# --plot took the next argument wrote its picture over a fixture pickle)
# cannot fail the suites of every mutant after it. restore_tree says when it
# put anything back.
clean=$scratch/clean
mkdir -p "$clean"
cp -a "$src/." "$clean/"
restore_tree() {
    diff -rq -x 'build-*' -x '__pycache__' "$clean" "$src" >"$scratch/restore.log" 2>&1 && return
    grep -Eq "^Files |^Only in $clean" "$scratch/restore.log" || return
    echo "mutate: the last mutant changed the tree's own files; put back ($(head -1 "$scratch/restore.log"))"
    cp -a "$clean/." "$src/"
}

# The suites, as `make test` runs them: every C and C++ test binary
# (tests/test_*.c, tests/test_*.cc), the fuzz corpus replay (fuzz-replay),
# each Python test module (python/test_NAME for python/tests/test_NAME.py)
# and each check script (check_NAME for tests/check_NAME.sh).
c_tests=$(cd "$src" && ls tests/test_*.c tests/test_*.cc 2>/dev/null | sed 's|tests/\(.*\)\.cc*$|\1|')
py_tests=$(cd "$src" && ls python/tests/test_*.py 2>/dev/null | sed 's|python/tests/\(.*\)\.py$|python/\1|')
sh_tests=$(cd "$src" && grep -o 'tests/check_[A-Za-z0-9_]*\.sh' Makefile | sed 's|tests/\(.*\)\.sh|\1|' | awk '!seen[$0]++')
fuzz_names=$(cd "$src" && ls tests/fuzz/fuzz_*.c 2>/dev/null | sed 's|tests/fuzz/\(.*\)\.c$|\1|')
all_tests="$c_tests${fuzz_names:+ fuzz-replay} $py_tests $sh_tests"
soversion=$(sed -n 's/^#define TALLY_VERSION "\([0-9]*\)\..*/\1/p' "$src/include/tally.h")
# What every suite needs: the libraries, the tools, the CUDA stand-in.
libs() { printf '%s/lib/libtally.so %s/lib/libtally.so.%s %s/lib/libtally.a %s/bin/tally %s/bin/demo %s/bin/demo-sleep %s/standin/libcuda.so.1 %s/bench/rmm-pool-model' "$1" "$1" "$soversion" "$1" "$1" "$1" "$1" "$1" "$1"; }
# The tests run the cuda and async backends against the CUDA stand-in
# (tests/standin/, a libcuda.so.1 on host memory), first on the library
# search path as the Makefile's STANDIN_ENV puts it, unless TALLY_REAL_CUDA=1
# (a GPU machine: the real driver). Without it the CUDA tests skip, and every
# mutation of lib/backend/cuda/ would survive.
with_standin() {
    local dir=$1; shift
    if [ "${TALLY_REAL_CUDA:-0}" = 1 ]; then
        "$@"
    else
        LD_LIBRARY_PATH=$src/$dir/standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
    fi
}

# build_suite DIR NAME: builds what suite NAME needs beyond libs (in $src).
build_suite() {
    local dir=$1 t=$2
    case $t in
        test_*) make -s BUILD="$dir" "$dir/tests/$t" ;;
        fuzz-replay) make -s BUILD="$dir" $(for f in $fuzz_names; do printf '%s/fuzz-replay/%s ' "$dir" "$f"; done) ;;
        *) true ;;
    esac
}
# run_suite DIR NAME: runs suite NAME against build DIR (in $src), under the
# timeout; its exit status is the suite's (124 or 137: timed out).
run_suite() {
    local dir=$1 t=$2
    case $t in
        test_*) BUILD=$dir with_standin "$dir" timeout -k 5 "$limit" "$dir/tests/$t" ;;
        fuzz-replay) REPLAY_TIMEOUT=$limit timeout -k 5 "$((limit * 2))" bash tests/fuzz/replay.sh "$dir/fuzz-replay" $fuzz_names ;;
        python/*) with_standin "$dir" env TALLY_LIB="$src/$dir/lib/libtally.so" TALLY_CLI="$src/$dir/bin/tally" \
            PYTHONPATH=python timeout -k 5 "$limit" python3 -m unittest discover -v -s python/tests -t python \
            -p "${t#python/}.py" ;;
        # A check script that takes an argument (check_exports) gets the
        # library, as make test-c passes it.
        check_*) local arg=""
            grep -q '\${1' "tests/$t.sh" && arg=$dir/lib/libtally.so
            env -u TEST_RESULTS -u TEST_TOTAL -u TEST_FILTER MAKE=make BUILD="$dir" \
            timeout -k 5 "$limit" bash "tests/$t.sh" $arg ;;
    esac
}
# failing_names LOG: up to three failing tests a suite's output names.
failing_names() {
    sed -n -e 's/^\[  FAILED  \] \(test_[A-Za-z0-9_]*\)$/\1/p' \
        -e 's/^\(FAIL\|ERROR\): \(test_[A-Za-z0-9_]*\) .*/\2/p' \
        -e 's/^FAIL \([^:]*\):.*/\1/p' \
        -e 's/^fuzz-replay: \(fuzz_[A-Za-z0-9_]*\) \(FAILED\|TIMED OUT\).*/\1/p' "$1" |
        awk '!seen[$0]++' | head -3 | tr '\n' ',' | sed 's/,$//; s/,/, /g'
}

check=${MUTATE_CHECK:-0}
[ "$check" = 1 ] || echo "mutate: building the unmodified tree in $scratch"
[ "$check" = 1 ] ||
if ! (cd "$src" && make -s -j"$jobs" BUILD=build-base $(libs build-base) >"$scratch/base.log" 2>&1 &&
      for t in $all_tests; do build_suite build-base "$t" || exit 1; done >>"$scratch/base.log" 2>&1); then
    echo "mutate: the unmodified tree does not build:" >&2
    tail -20 "$scratch/base.log" >&2
    exit 2
fi
# The unmodified tree must pass, or every mutation would look killed.
[ "$check" = 1 ] || for t in $all_tests; do
    if ! (cd "$src" && run_suite build-base "$t" >"$scratch/base-suite.log" 2>&1); then
        echo "mutate: $t fails on the unmodified tree; fix that first:" >&2
        tail -20 "$scratch/base-suite.log" >&2
        exit 2
    fi
done

# Suites for a file: those coverage.txt names first; for a Python file the
# Python suites next; then the rest.
order_for() {
    local file=$1 first="" t
    first=$(awk -v f="$file" '$1 == f ":" { $1 = ""; print }' "$coverage" 2>/dev/null)
    case $file in python/*) first="$first $py_tests" ;; esac
    local seen=" " rest=$all_tests
    # A screen stops after the named suites (all of them for a file that
    # coverage.txt does not name).
    [ "$screen" = 1 ] && [ -n "${first// /}" ] && rest=""
    for t in $first $rest; do
        case "$seen" in *" $t "*) continue ;; esac
        seen="$seen$t "
        printf '%s ' "$t"
    done
}

# object_of FILE OUT: FILE (a .c file of the tree in $src) compiled alone
# into OUT at -O2 without debug information; fails when it does not compile.
object_of() {
    (cd "$src" && ${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -fPIC -fvisibility=hidden -w \
        -Iinclude -Ilib -Itools -Ibench -Itests -c "$1" -o "$2") >/dev/null 2>&1
}
# same_object FILE PRISTINE_OBJECT: whether the mutated FILE compiles to the
# very bytes of the original's object (trivial compiler equivalence).
same_object() {
    case $1 in *.c) ;; *) return 1 ;; esac
    [ -s "$2" ] && object_of "$1" "$scratch/mutant.o" && cmp -s "$2" "$scratch/mutant.o"
}

# The second look under sanitizers. san_base builds build-base-san from the
# unmodified tree, once; san_suite_ok T checks, once per suite, that T passes
# there (a suite that does not is never used to kill).
san_state=none san_good=" " san_broken=" "
san_make() { make -s -j"$jobs" OPT=-O1 SAN="$san_flags" "$@"; }
# A sanitized suite runs two to three times slower, so it gets three times
# the limit (test_tune under ASan took over 120 s on a loaded 2-core machine
# and was left out of the second look); bash's dynamic scope hands the local
# limit to run_suite.
san_run() {
    local limit=$((limit * 3))
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=0 run_suite "$@"
}
san_base() {
    [ "$san_state" = none ] || { [ "$san_state" = ready ]; return; }
    san_state=broken
    (cd "$src" && san_make BUILD=build-base-san $(libs build-base-san)) >"$scratch/san-base.log" 2>&1 || return 1
    san_state=ready
}
san_suite_ok() {
    case "$san_good" in *" $1 "*) return 0 ;; esac
    case "$san_broken" in *" $1 "*) return 1 ;; esac
    if (cd "$src" && san_make BUILD=build-base-san "build-base-san/tests/$1" && san_run build-base-san "$1") \
        >"$scratch/san-suite.log" 2>&1; then
        san_good="$san_good$1 "
        return 0
    fi
    san_broken="$san_broken$1 "
    echo "mutate: $1 fails under ASan/UBSan on the unmodified tree: not used for the second look"
    return 1
}
# try_sanitized FILE MUTATED: FILE is as in the unmodified tree and MUTATED
# holds its mutated text, which survived the suites. Checks the suites
# first, then puts the mutation in, builds build-ms and runs them; sets
# verdict to "killed under ASan/UBSan by SUITE" or "". The caller restores
# FILE.
try_sanitized() {
    local file=$1 mutated=$2 t rc suites=""
    verdict=""
    for t in $(awk -v f="$file" '$1 == f ":" { $1 = ""; print }' "$coverage" 2>/dev/null); do
        case $t in test_*) [ -f "$src/tests/$t.c" ] && san_suite_ok "$t" && suites="$suites $t" ;; esac
    done
    [ -n "$suites" ] || return 0
    cp "$mutated" "$src/$file"
    rm -rf "$src/build-ms"
    cp -a "$src/build-base-san" "$src/build-ms"
    touch "$src/$file"
    (cd "$src" && san_make BUILD=build-ms $(libs build-ms)) >"$scratch/ms.log" 2>&1 || return 0
    for t in $suites; do
        (cd "$src" && san_make BUILD=build-ms "build-ms/tests/$t") >"$scratch/ms.log" 2>&1 || continue
        (cd "$src" && san_run build-ms "$t" >"$scratch/ms-test.log" 2>&1)
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ]; then
            verdict="killed under ASan/UBSan by $t"
            return 0
        fi
    done
}

# A timeout kills only where the machine could have finished the suite:
# timeout_stands T runs the unmodified tree's T right after a mutant's T ran
# past the limit, and says yes when it passes within half the limit. Else the
# machine is too loaded to tell a hang from a slow run (on 2026-12-05 a test
# job in another session group made test_tune take 222 s, and three mutants
# that test_tune never hangs on were "killed (timeout)" by it), and the
# mutant's T runs again under long_run, four times the limit; bash's dynamic
# scope hands the local limit to run_suite, as in san_run.
timeout_stands() {
    local start=$SECONDS rc
    (cd "$src" && run_suite build-base "$1" >"$scratch/base-suite.log" 2>&1)
    rc=$?
    [ $rc -eq 0 ] && [ $((SECONDS - start)) -le $((limit / 2)) ]
}
long_run() {
    local limit=$((limit * 4))
    run_suite "$@"
}

# try_mutant FILE: the tree in $src holds one mutation, in FILE. Builds it
# into build-m (a copy of build-base) and runs the suites in order_for's
# order, stopping at the first failure. Sets verdict: "" (survived),
# "stillborn (...)" (it does not build), or "killed ... by SUITE (tests)".
try_mutant() {
    local file=$1 t rc which
    verdict=""
    case $file in
        *.py)
            if ! python3 -m py_compile "$src/$file" >"$scratch/m.log" 2>&1; then
                verdict="stillborn (does not compile)"
                return
            fi ;;
    esac
    if [ -n "${2:-}" ] && same_object "$file" "$2"; then
        verdict="equivalent (same object code)"
        return
    fi
    rm -rf "$src/build-m"
    cp -a "$src/build-base" "$src/build-m"
    touch "$src/$file"
    # Suites are built one at a time, just before they run: most mutations
    # are killed by the first, and the rest are never linked.
    if ! (cd "$src" && make -s -j"$jobs" BUILD=build-m $(libs build-m) >"$scratch/m.log" 2>&1); then
        verdict="stillborn (does not build)"
        return
    fi
    for t in $(order_for "$file"); do
        if ! (cd "$src" && build_suite build-m "$t" >"$scratch/m.log" 2>&1); then
            verdict="stillborn (does not build $t)"
            return
        fi
        (cd "$src" && run_suite build-m "$t" >"$scratch/m-test.log" 2>&1)
        rc=$?
        local again=""
        if { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && ! timeout_stands "$t"; then
            (cd "$src" && long_run build-m "$t" >"$scratch/m-test.log" 2>&1)
            rc=$?
            again=", again at $((limit * 4)) s: the machine was loaded"
        fi
        which=$(failing_names "$scratch/m-test.log")
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            verdict="killed (timeout$again) by $t"
            return
        elif [ $rc -ne 0 ]; then
            verdict="killed by $t${which:+ ($which)}"
            return
        fi
    done
}

total=0 killed=0 stale=0 n=0 equiv=0 stillborn=0
survivors="" equivalents=""
[ "$listed" = 1 ] || list=/dev/null
while IFS=$'\t' read -r file orig repl what note || [ -n "$file" ]; do
    case "$file" in '' | '#'*) continue ;; esac
    n=$((n + 1))
    if [ -n "$pattern" ] && ! [[ "$file $what" =~ $pattern ]]; then continue; fi
    label="#$n $file: $what"
    if [ -z "${repl+x}" ] || [ -z "$what" ]; then
        echo "$label: malformed entry (want 4 tab-separated fields)"
        stale=$((stale + 1))
        continue
    fi
    count=$(python3 - "$src/$file" "$orig" <<'PY'
import sys
try:
    print(open(sys.argv[1], encoding="utf-8").read().count(sys.argv[2]))
except OSError:
    print(0)
PY
)
    if [ "$count" != 1 ]; then
        echo "$label: stale mutation (the original text is found $count times in $file): not counted"
        stale=$((stale + 1))
        continue
    fi
    total=$((total + 1))
    if [ "$check" = 1 ]; then
        killed=$((killed + 1))
        continue
    fi
    restore_tree
    cp -p "$src/$file" "$scratch/pristine"
    python3 - "$src/$file" "$orig" "$repl" <<'PY'
import sys
p, a, b = sys.argv[1:]
s = open(p, encoding="utf-8").read()
open(p, "w", encoding="utf-8").write(s.replace(a, b, 1))
PY
    try_mutant "$file"
    cp -p "$scratch/pristine" "$src/$file"
    case $verdict in
        stillborn*)
            # A mutation that does not build proves nothing about the tests.
            stillborn=$((stillborn + 1))
            total=$((total - 1))
            echo "$label: $verdict: not counted" ;;
        ?*)
            killed=$((killed + 1))
            echo "$label: $verdict"
            case "${note:-}" in equivalent*) echo "    (listed as equivalent, yet killed: drop the mark)" ;; esac ;;
        *)
            if [[ "${note:-}" == equivalent* ]]; then
                equiv=$((equiv + 1))
                echo "$label: survived (listed as ${note})"
                equivalents="$equivalents#$n $file: $what"$'\n'"    ${note}"$'\n'
            else
                echo "$label: SURVIVED"
                survivors="$survivors#$n $file: $what"$'\n'"    '$orig' -> '$repl'"$'\n'
            fi ;;
    esac
done <"$list"

# ---- the blind sample ---------------------------------------------------------
# MUTATE_BLIND mutations generated from the source by tests/mutate/blind.py
# (comparisons, conditions, constants, dropped unlock / wait / synchronise
# calls, swapped fields and arguments) with MUTATE_SEED, over lib/, tools/
# and python/; never chosen by looking at the tests.
b_total=0 b_killed=0 b_stillborn=0 b_survivors="" b_tce=0 b_argued=0 b_equivalents=""
# argued_equivalent FILE ORIG REPL WHAT: the reason equivalent.txt gives for
# this mutant (leading blanks not compared), or nothing. An entry with a
# fifth column holds only for a mutant in that function (WHAT ends "in F"):
# the same line text can sit in two functions and be equivalent in one.
argued_equivalent() {
    [ -f "$equivalent_list" ] || return 0
    python3 - "$equivalent_list" "$1" "$2" "$3" "${4:-}" <<'PY'
import sys
path, f, a, b, what = sys.argv[1], sys.argv[2], sys.argv[3].strip(), sys.argv[4].strip(), sys.argv[5]
for line in open(path, encoding="utf-8"):
    if not line.strip() or line.startswith("#"):
        continue
    parts = line.rstrip("\n").split("\t")
    if len(parts) >= 4 and parts[0] == f and parts[1].strip() == a and parts[2].strip() == b:
        if len(parts) >= 5 and parts[4].strip() and not what.endswith(" in " + parts[4].strip()):
            continue
        print(parts[3])
        break
PY
}
if [ "$blind" -gt 0 ] || [ -n "$blind_file" ]; then
    if [ -n "$blind_file" ]; then
        cp "$blind_file" "$scratch/blind.tsv" || exit 2
        drawn_from="from $blind_file"
    else
        python3 "$src/tests/mutate/blind.py" "$src" "$blind" "$seed" >"$scratch/blind.tsv" || exit 2
        drawn_from="(seed $seed)"
    fi
    echo
    [ "$screen" = 1 ] && echo "mutate: a screen (only the suites coverage.txt names), not a score"
    echo "mutate: blind sample of $(wc -l <"$scratch/blind.tsv") $drawn_from over lib/, tools/, python/"
    bn=0
    while IFS=$'\t' read -r file line orig repl kind what; do
        bn=$((bn + 1))
        label="blind #$bn $file:$line [$kind] $what"
        if [ "$check" = 1 ]; then
            echo "$label"
            continue
        fi
        restore_tree
        cp -p "$src/$file" "$scratch/pristine"
        rm -f "$scratch/pristine.o"
        case $file in *.c) [ "$check" = 1 ] || object_of "$file" "$scratch/pristine.o" || rm -f "$scratch/pristine.o" ;; esac
        if ! python3 - "$src/$file" "$line" "$orig" "$repl" <<'PY'
import sys
p, n, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lines = open(p, encoding="utf-8").read().split("\n")
if lines[n - 1] != a:
    sys.exit(1)
lines[n - 1] = b
open(p, "w", encoding="utf-8").write("\n".join(lines))
PY
        then
            echo "$label: the line is not what blind.py read (not counted)"
            continue
        fi
        try_mutant "$file" "$scratch/pristine.o"
        if [ -z "$verdict" ] && [ "$sanitize" = 1 ] && [ "$check" != 1 ]; then
            case $file in
                *.c | *.h)
                    # The sanitized base is built from the unmodified tree.
                    cp -p "$src/$file" "$scratch/mutated"
                    cp -p "$scratch/pristine" "$src/$file"
                    if san_base; then
                        try_sanitized "$file" "$scratch/mutated"
                        rm -rf "$src/build-ms"
                    else
                        echo "mutate: the unmodified tree does not build under ASan/UBSan; no second look:" >&2
                        tail -5 "$scratch/san-base.log" >&2
                        sanitize=0
                    fi ;;
            esac
        fi
        cp -p "$scratch/pristine" "$src/$file"
        case $verdict in
            stillborn*)
                b_stillborn=$((b_stillborn + 1))
                echo "$label: $verdict: not counted" ;;
            equivalent*)
                b_tce=$((b_tce + 1))
                echo "$label: $verdict: not counted" ;;
            ?*)
                b_total=$((b_total + 1)) b_killed=$((b_killed + 1))
                echo "$label: $verdict" ;;
            *)
                b_total=$((b_total + 1))
                why=$(argued_equivalent "$file" "$orig" "$repl" "$what")
                if [ -n "$why" ]; then
                    b_argued=$((b_argued + 1))
                    echo "$label: survived (equivalent.txt: $why)"
                    b_equivalents="$b_equivalents$file:$line [$kind] $what"$'\n'"    $why"$'\n'
                    continue
                fi
                echo "$label: $([ "$screen" = 1 ] && echo "SURVIVED the screen" || echo SURVIVED)"
                b_survivors="$b_survivors$file:$line [$kind] $what"$'\n'"    '$(printf '%s' "$orig" | sed 's/^ *//')' -> '$(printf '%s' "$repl" | sed 's/^ *//')'"$'\n' ;;
        esac
    done <"$scratch/blind.tsv"
fi
rm -rf "$src/build-m"

pct() { echo "$(($1 * 1000 / $2 / 10)).$(($1 * 1000 / $2 % 10))%"; }
echo
if [ -n "$equivalents" ]; then
    echo "equivalent (survived as listed, left out of the score):"
    printf '%s' "$equivalents"
fi
if [ -n "$survivors" ]; then
    echo "survivors:"
    printf '%s' "$survivors"
fi
if [ -n "$b_equivalents" ]; then
    echo "blind survivors that tests/mutate/equivalent.txt shows equivalent:"
    printf '%s' "$b_equivalents"
fi
if [ -n "$b_survivors" ]; then
    echo "blind survivors $drawn_from:"
    printf '%s' "$b_survivors"
fi
[ "$stale" -gt 0 ] && echo "stale or malformed entries (not counted): $stale"
scored=$((total - equiv))
ok=1
if [ "$check" = 1 ]; then
    echo "mutate: $total entries apply"
elif [ "$listed" != 1 ]; then
    :
elif [ "$scored" -gt 0 ]; then
    echo "mutate: listed: $killed of $scored killed ($(pct "$killed" "$scored"));" \
        "$equiv equivalent left out, $((scored - killed)) survived, $stale stale, $stillborn stillborn"
    [ "$killed" -eq "$scored" ] && [ "$stale" -eq 0 ] || ok=0
else
    echo "mutate: listed: no mutation scored"
    ok=0
fi
if [ "$check" != 1 ] && { [ "$blind" -gt 0 ] || [ -n "$blind_file" ]; }; then
    if [ -n "$blind_file" ]; then how="MUTATE_BLIND_FILE=$blind_file"; else how="seed $seed (MUTATE_SEED=$seed MUTATE_BLIND=$blind)"; fi
    [ "$screen" = 1 ] && how="$how, a screen (MUTATE_SCREEN=1): not a score"
    if [ "$b_total" -gt 0 ]; then
        echo "mutate: blind:  $b_killed of $b_total killed ($(pct "$b_killed" "$b_total")); $((b_total - b_killed))" \
            "survived, $b_tce of the same object code left out, $b_stillborn stillborn;" \
            "$((b_total + b_tce + b_stillborn)) drawn, $how"
        scored_b=$((b_total - b_argued))
        if [ "$scored_b" -gt 0 ]; then
            echo "mutate: blind, leaving out the $b_argued that equivalent.txt shows equivalent:" \
                "$b_killed of $scored_b killed ($(pct "$b_killed" "$scored_b"))"
            [ $((b_killed * 100)) -ge $((goal * scored_b)) ] || ok=0
        else
            ok=0
        fi
    else
        echo "mutate: blind: no mutation scored (seed $seed)"
        ok=0
    fi
fi
[ "$ok" = 1 ]
