# tally tune in `make bench` (called by bench/run.sh; docs/tune.md):
#   1. speed: `tally tune` on a synthetic trace of more than 30,000 events
#      (gen_trace --model 7b --steps 9) over its whole grid, on all CPUs;
#      target: under 10 s for 20 settings.
#   2. the trace option's cost: the hot path (1 thread, sizes <= 256 KiB)
#      with trace:true against the same process kind without, alternated
#      three times; the difference per pair is the cost of recording one
#      allocation and its free.
# Prints a Markdown section on stdout; raw output goes to OUT.
#   bash bench/tune.sh BUILD OUT
set -euo pipefail
BUILD=$1
OUT=$2
TALLY=$BUILD/bin/tally
for f in "$TALLY" "$BUILD/bench/gen_trace" "$BUILD/bench/hotpath-glibc"; do
  if [ ! -x "$f" ]; then
    echo "tune.sh: $f is missing; run make bench" >&2
    exit 1
  fi
done
# TALLY_BENCH_QUICK=1 (bench/run.sh --quick): a 1-step trace, one alternation.
steps=9 runs="1 2 3" hot=()
if [ "${TALLY_BENCH_QUICK:-0}" = 1 ]; then steps=1 runs=1 hot=(--reps 1 --rep-ms 1); fi
TRACE=$OUT/tune-7b-${steps}steps.csv
"$BUILD/bench/gen_trace" --model 7b --steps $steps --out "$TRACE" >/dev/null 2>&1
events=$(($(wc -l <"$TRACE") - 1))
t0=$(date +%s.%N)
"$TALLY" tune --json "$TRACE" >"$OUT/tune.json" 2>"$OUT/tune.err"
t1=$(date +%s.%N)
settings=$(grep -c '"setting"' "$OUT/tune.json")
for i in $runs; do
  "$BUILD/bench/hotpath-glibc" --only tally --rounds 1 --threads 1 --sizes small "${hot[@]}" --label trace-off >"$OUT/trace-off-$i.txt"
  "$BUILD/bench/hotpath-glibc" --only tally --rounds 1 --threads 1 --sizes small "${hot[@]}" --label trace-on \
    --conf trace:true >"$OUT/trace-on-$i.txt"
done

echo "## tally tune"
echo
echo "\`tally tune --json\` on a synthetic trace (gen_trace --model 7b --steps $steps), $(nproc) workers:"
echo
echo "| trace | events | settings | seconds | target |"
echo "|---|---:|---:|---:|---|"
awk -v st="$steps" -v e="$events" -v s="$settings" -v a="$t0" -v b="$t1" 'BEGIN {
  t = b - a
  printf "| tune-7b-" st "steps.csv | %d | %d | %.2f | %s |\n", e, s, t, (e >= 30000 && s >= 20 && t < 10) ? "met (30,000 events, 20 settings, < 10 s)" : "NOT met (30,000 events, 20 settings, < 10 s)"
}'
echo
echo "Cost of trace:true on the hot path (CPU ns per allocate+free pair, 1 thread, sizes <= 256 KiB, median of three alternated processes):"
echo
echo "| pattern | trace off | trace on | cost per allocation (its alloc and free records) |"
echo "|---|---:|---:|---:|"
cat "$OUT"/trace-o*.txt | grep '^R ' | awk '
function median(key,    n, i, j, t, a) {
  n = cnt[key]
  for (i = 1; i <= n; i++) a[i] = val[key, i]
  for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ key = $2 SUBSEP $4; cnt[key]++; val[key, cnt[key]] = $6 }
END {
  np = split("pair fifo lifo", P, " ")
  for (p = 1; p <= np; p++) {
    off = median("trace-off" SUBSEP P[p]); on = median("trace-on" SUBSEP P[p])
    printf "| %s | %.1f | %.1f | %.1f ns |\n", P[p], off, on, on - off
  }
}'
