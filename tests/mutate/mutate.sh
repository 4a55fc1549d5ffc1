#!/usr/bin/env bash
# make mutate: one-line mutation testing.
#
# Each entry of tests/mutate/mutations.txt (tab-separated: file, a fragment
# of one original line, its replacement, the behaviour the change breaks,
# and optionally "equivalent: why" for a mutation shown to behave the same) is
# applied alone to a scratch copy of the tree, built into its own build
# directory (a copy of a pristine build, so only the mutated file and what
# links it are rebuilt), and the C test binaries are run: first those that
# cover the file (tests/mutate/coverage.txt), then the rest, stopping at the
# first failure. A mutation that fails a test is killed; one that passes
# every binary survives. A binary that runs past MUTATE_TIMEOUT seconds
# (default 120) is killed and counts as "killed (timeout)". An entry whose
# fragment is not found, or is found more than once, is reported as a stale
# mutation and left out of the score (never counted as killed). An entry
# marked equivalent that survives is left out of the score too and listed
# with its reason; one that is killed is counted, and flagged so the mark
# can go.
#
#   bash tests/mutate/mutate.sh [REGEX]   only entries whose file and
#                                         description match REGEX (bash =~;
#                                         also MUTATE_ONLY=REGEX, as make passes it)
# Environment: MUTATE_LIST (the list), MUTATE_TIMEOUT, MUTATE_KEEP=1 keeps
# the scratch directory, MUTATE_JOBS (make -j, default 2), MUTATE_CHECK=1
# only checks that every entry applies (no build, no tests).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
list=${MUTATE_LIST:-$root/tests/mutate/mutations.txt}
coverage=$root/tests/mutate/coverage.txt
limit=${MUTATE_TIMEOUT:-120}
jobs=${MUTATE_JOBS:-2}
pattern=${1:-${MUTATE_ONLY:-}}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/tally-mutate.XXXXXX")
cleanup() { [ "${MUTATE_KEEP:-0}" = 1 ] || rm -rf "$scratch"; }
trap cleanup EXIT
src=$scratch/src
mkdir -p "$src"

# The scratch tree: every tracked and untracked-but-not-ignored file as it
# is now (uncommitted edits included); the working tree is never touched.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$root" && xargs -0 cp -p --parents -t "$src" 2>/dev/null)

all_tests=$(cd "$src" && ls tests/test_*.c | sed 's|tests/\(.*\)\.c|\1|')
libs() { printf '%s/lib/libtally.so %s/lib/libtally.a %s/bin/tally %s/standin/libcuda.so.1' "$1" "$1" "$1" "$1"; }
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

check=${MUTATE_CHECK:-0}
[ "$check" = 1 ] || echo "mutate: building the unmodified tree in $scratch"
[ "$check" = 1 ] ||
if ! (cd "$src" && make -s -j"$jobs" BUILD=build-base $(libs build-base) \
    $(for t in $all_tests; do printf 'build-base/tests/%s ' "$t"; done) >"$scratch/base.log" 2>&1); then
    echo "mutate: the unmodified tree does not build:" >&2
    tail -20 "$scratch/base.log" >&2
    exit 2
fi
# The unmodified tree must pass, or every mutation would look killed.
[ "$check" = 1 ] || for t in $all_tests; do
    if ! (cd "$src" && BUILD=build-base with_standin build-base timeout "$limit" build-base/tests/"$t" >"$scratch/base-$t.log" 2>&1); then
        echo "mutate: $t fails on the unmodified tree; fix that first:" >&2
        tail -20 "$scratch/base-$t.log" >&2
        exit 2
    fi
done

# Test binaries for a file: those coverage.txt names first, then the rest.
order_for() {
    local file=$1 first="" t
    first=$(awk -v f="$file" '$1 == f ":" { $1 = ""; print }' "$coverage" 2>/dev/null)
    local seen=" "
    for t in $first $all_tests; do
        case "$seen" in *" $t "*) continue ;; esac
        seen="$seen$t "
        printf '%s ' "$t"
    done
}

total=0 killed=0 stale=0 n=0 equiv=0
survivors="" equivalents=""
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
    cp -p "$src/$file" "$scratch/pristine"
    python3 - "$src/$file" "$orig" "$repl" <<'PY'
import sys
p, a, b = sys.argv[1:]
s = open(p, encoding="utf-8").read()
open(p, "w", encoding="utf-8").write(s.replace(a, b, 1))
PY
    rm -rf "$src/build-m"
    cp -a "$src/build-base" "$src/build-m"
    touch "$src/$file"
    verdict=""
    # Test binaries are linked one at a time, just before they run: most
    # mutations are killed by the first, and the rest are never linked.
    if ! (cd "$src" && make -s -j"$jobs" BUILD=build-m $(libs build-m) >"$scratch/m.log" 2>&1); then
        verdict="killed (does not build)"
    else
        for t in $(order_for "$file"); do
            if ! (cd "$src" && make -s BUILD=build-m build-m/tests/"$t" >"$scratch/m.log" 2>&1); then
                verdict="killed (does not build)"
                break
            fi
            (cd "$src" && BUILD=build-m with_standin build-m timeout -k 5 "$limit" build-m/tests/"$t" >"$scratch/m-test.log" 2>&1)
            rc=$?
            # The failing cmocka tests, by name, when the binary lists them.
            which=$(sed -n 's/^\[  FAILED  \] \(test_[A-Za-z0-9_]*\)$/\1/p' "$scratch/m-test.log" |
                sort -u | head -3 | tr '\n' ' ')
            if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
                verdict="killed (timeout) by $t"
                break
            elif [ $rc -ne 0 ]; then
                verdict="killed by $t${which:+ (${which% })}"
                break
            fi
        done
    fi
    cp -p "$scratch/pristine" "$src/$file"
    if [ -n "$verdict" ]; then
        killed=$((killed + 1))
        echo "$label: $verdict"
        case "${note:-}" in equivalent*) echo "    (listed as equivalent, yet killed: drop the mark)" ;; esac
    elif [[ "${note:-}" == equivalent* ]]; then
        equiv=$((equiv + 1))
        echo "$label: survived (listed as ${note})"
        equivalents="$equivalents#$n $file: $what"$'\n'"    ${note}"$'\n'
    else
        echo "$label: SURVIVED"
        survivors="$survivors#$n $file: $what"$'\n'"    '$orig' -> '$repl'"$'\n'
    fi
done <"$list"
rm -rf "$src/build-m"

echo
if [ -n "$equivalents" ]; then
    echo "equivalent (survived as listed, left out of the score):"
    printf '%s' "$equivalents"
fi
if [ -n "$survivors" ]; then
    echo "survivors:"
    printf '%s' "$survivors"
fi
[ "$stale" -gt 0 ] && echo "stale or malformed entries (not counted): $stale"
scored=$((total - equiv))
if [ "$check" = 1 ]; then
    echo "mutate: $total entries apply"
elif [ "$scored" -gt 0 ]; then
    echo "mutate: $killed of $scored killed ($((killed * 1000 / scored / 10)).$((killed * 1000 / scored % 10))%);" \
        "$equiv equivalent left out, $((scored - killed)) survived, $stale stale"
else
    echo "mutate: no mutation scored"
fi
[ "$scored" -gt 0 ] && [ "$killed" -eq "$scored" ] && [ "$stale" -eq 0 ]
