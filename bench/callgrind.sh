#!/usr/bin/env bash
# Instructions per allocate+free pair (one thread, sizes <= 256 KiB), counted
# by callgrind: a figure that, unlike time, does not move with the load on the
# machine. Each configuration runs twice with a different number of timed
# pairs; the difference of the inclusive counts of the pattern function,
# divided by the difference of pairs, is the cost of one pair (warm-up and
# set-up cancel out). Then the same for PyTorch's entry points against
# mimalloc (bench/torchpath.c) on each of its four size patterns, from two
# runs of 100 and 300 batches of 64.
#   bash bench/callgrind.sh <build dir>      (run.sh calls it when valgrind exists)
set -euo pipefail
BUILD=$(cd "${1:?usage: bash bench/callgrind.sh <build dir>}" && pwd)
BIN=$BUILD/bench
OUT=$BUILD/bench-results/callgrind
mkdir -p "$OUT"
rm -f "$OUT"/*
P1=10048
P2=30016
# <name> <binary> <extra args...>: writes $OUT/<name>.txt with "<function> <instructions per pair>"
count() {
  local name=$1 bin=$2
  shift 2
  for p in $P1 $P2; do
    valgrind --tool=callgrind --toggle-collect='pair_*' --toggle-collect='fifo_*' --toggle-collect='lifo_*' \
      --callgrind-out-file="$OUT/$name-$p.cg" "$BIN/$bin" --sizes small --threads 1 --rounds 1 --reps 1 \
      --pairs "$p" "$@" >/dev/null 2>"$OUT/$name-$p.log"
    callgrind_annotate --inclusive=yes "$OUT/$name-$p.cg" 2>/dev/null |
      awk -v p="$p" '$0 !~ /=>/ && match($0, /hotpath\.c:(pair|fifo|lifo)_(sys|tally) /) {
        f = substr($0, RSTART + 10, RLENGTH - 11); n = $1; gsub(",", "", n); print f, p, n }'
  done | awk -v d=$((P2 - P1)) '{ v[$1, $2] = $3; f[$1] = 1; if ($2 > hi) hi = $2; if (lo == "" || $2 < lo) lo = $2 }
    END { for (x in f) printf "%s %.0f\n", x, (v[x, hi] - v[x, lo]) / d }' >"$OUT/$name.txt"
}
count glibc hotpath-glibc
count jemalloc hotpath-jemalloc --only sys
count mimalloc hotpath-mimalloc --only sys
count ledger-off hotpath-glibc --only tally --conf ledger:false

get() { awk -v f="$2" '$1 == f { print $2 }' "$OUT/$1.txt"; }
echo "| pattern | glibc | jemalloc | mimalloc | tally ledger on | tally ledger off | tally/mimalloc | ledger on/off |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for p in pair fifo lifo; do
  g=$(get glibc ${p}_sys); j=$(get jemalloc ${p}_sys); m=$(get mimalloc ${p}_sys)
  on=$(get glibc ${p}_tally); off=$(get ledger-off ${p}_tally)
  awk -v p=$p -v g="$g" -v j="$j" -v m="$m" -v on="$on" -v off="$off" 'BEGIN {
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", p, g, j, m, on, off,
      (m > 0 ? sprintf("%.2f", on / m) : "-"), (off > 0 ? sprintf("%.3f", on / off) : "-") }'
done

# PyTorch's entry points (tally_torch_alloc / tally_torch_free) against
# mimalloc: inclusive instructions of run_torch and pair_sets.c's
# pair_run_malloc, per pair.
tp() {
  local pat=$1
  for b in 100 300; do
    valgrind --tool=callgrind --callgrind-out-file="$OUT/torchpath-$pat-$b.cg" "$BIN/torchpath-mimalloc" --reps 1 \
      --batches "$b" --pattern "$pat" >/dev/null 2>"$OUT/torchpath-$pat-$b.log"
    callgrind_annotate --inclusive=yes "$OUT/torchpath-$pat-$b.cg" 2>/dev/null |
      awk -v b="$b" '$0 !~ /=>/ && match($0, /(torchpath\.c:run_torch|pair_sets\.c:pair_run_malloc) /) {
        f = $0 ~ /run_torch / ? "torch" : "malloc"; n = $1; gsub(",", "", n); print f, b, n }'
  done | awk -v pat="$pat" -v d=$(((300 - 100) * 64)) '{ v[$1, $2] = $3 }
    END { t = (v["torch", 300] - v["torch", 100]) / d; m = (v["malloc", 300] - v["malloc", 100]) / d
      printf "| %s | %.0f | %.0f | %s |\n", pat, m, t, (m > 0 ? sprintf("%.2f", t / m) : "-") }'
}
echo
echo "PyTorch's entry points (tally_torch_alloc + tally_torch_free, ledger on) against mimalloc, batches of 64 (bench/torchpath.c):"
echo
echo "| pattern | mimalloc | tally_torch | tally/mimalloc |"
echo "|---|---:|---:|---:|"
for p in loguniform mix16 mix512-64k small4k; do tp $p; done
