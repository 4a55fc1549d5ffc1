#!/usr/bin/env bash
# Runs tally's benchmarks and prints one report (Markdown tables).
#   bash bench/run.sh [--quick] <build dir>
# --quick (make bench-quick, in .ci/run): every program runs a few seconds
# (fewer repetitions, pairs and settings; no callgrind) and the report has
# every table, but its figures are not measurements.
# Builds nothing: `make -C bench BUILD=<abs build dir>` builds the binaries
# and the synthetic traces first (the top Makefile's `bench` target does both).
# Traces: $TALLY_TRACES, else ../shared/traces next to the repository.
# Raw results stay in <build dir>/bench-results/. About 2 minutes on 2 CPUs.
set -euo pipefail

quick=0
if [ "${1:-}" = --quick ]; then quick=1; shift; fi
if [ $# -ne 1 ]; then
  echo "usage: bash bench/run.sh [--quick] <build dir>" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
TRACES=${TALLY_TRACES:-$ROOT/../shared/traces}
if [ ! -d "$TRACES" ]; then
  echo "run.sh: no trace directory at $TRACES (set TALLY_TRACES)" >&2
  exit 1
fi
TRACES=$(cd "$TRACES" && pwd)
BIN=$BUILD/bench
for f in "$BIN/hotpath-glibc" "$BIN/hotpath-jemalloc" "$BIN/hotpath-mimalloc" "$BUILD/bin/tally-replay" \
  "$BUILD/bin/tally-driver-cost" "$BUILD/standin/libcuda.so.1" \
  "$BIN/torchpath-mimalloc" "$BIN/pt-expand-model" "$BIN/unwind" "$BIN/tally-steps" "$BIN/turns" "$BIN/pair-ab" \
  "$BIN/tally-empty-cache" "$BIN/rmm-pool-model"; do
  if [ ! -x "$f" ]; then
    echo "run.sh: $f is missing; run: make -C bench BUILD=$BUILD" >&2
    exit 1
  fi
done
OUT=$BUILD/bench-results
mkdir -p "$OUT"
rm -f "$OUT"/*.txt
export TALLY_TRACES=$TRACES
# The benchmarks set their own tally configuration; a TALLY_CONF from the
# environment would be applied on top of it, so it is cleared here.
unset TALLY_CONF

start=$(date +%s)
step() { echo "run.sh: $*" >&2; }
# Quick mode: the same programs and tables on a small budget.
HOT_QUICK=() RUNS="1 2 3" REPLAY_REPS=() GROW="2 4 8 12 16 20 32 40" HANDLE="0 4 10 20 32 48 64 96 128"
TORCH_QUICK=() UNWIND_QUICK=() PY_QUICK=() TURNS_QUICK=()
if [ $quick = 1 ]; then
  HOT_QUICK=(--reps 1 --rounds 1 --rep-ms 1) RUNS=1 REPLAY_REPS=(--reps 1) GROW="20" HANDLE="64"
  TORCH_QUICK=(--reps 1 --batches 20) UNWIND_QUICK=(--quick) PY_QUICK=(--quick) TURNS_QUICK=(--reps 1 --pairs 256)
  export TALLY_BENCH_QUICK=1 TALLY_BENCH_CALLGRIND=0
fi

# 1. Hot path: each system allocator against tally in the same process.
for a in glibc jemalloc mimalloc; do
  step "hot path, $a against tally"
  "$BIN/hotpath-$a" "${HOT_QUICK[@]}" >"$OUT/hotpath-$a.txt"
done
# 2. Ledger on / off (not changeable at run time: separate processes,
#    alternated three times), and backtraces of depth 16.
for i in $RUNS; do
  step "hot path, tally ledger on / off ($i of 3)"
  "$BIN/hotpath-glibc" --only tally --rounds 1 "${HOT_QUICK[@]}" --label ledger-on >"$OUT/ledger-on-$i.txt"
  "$BIN/hotpath-glibc" --only tally --rounds 1 "${HOT_QUICK[@]}" --label ledger-off --conf ledger:false >"$OUT/ledger-off-$i.txt"
done
step "hot path, tally with backtrace_depth:16"
"$BIN/hotpath-glibc" --only tally --rounds 1 "${HOT_QUICK[@]}" --label bt16 --conf backtrace_depth:16 >"$OUT/backtrace.txt"
step "allocation sites: unwinders at depth 16, python_stack:8 from a Python loop"
"$BIN/unwind" "${UNWIND_QUICK[@]}" >"$OUT/unwind.txt"
python3 "$HERE/pystack.py" "$BUILD/lib/libtally.so" "${PY_QUICK[@]}" >"$OUT/pystack.txt"
# 3. Replay of the recorded and the synthetic traces.
step "replay"
replay_args=("$TRACES")
if [ -d "$BUILD/traces" ]; then replay_args+=("$BUILD/traces"); fi
"$BUILD/bin/tally-replay" --check "${REPLAY_REPS[@]}" "${replay_args[@]}" >"$OUT/replay.txt"
step "replay with expandable segments"
"$BUILD/bin/tally-replay" --check "${REPLAY_REPS[@]}" --conf expandable_segments:true "${replay_args[@]}" >"$OUT/replay-expandable.txt"
step "PyTorch's expandable segments (model), the expandable_grow_chunk_mb and expandable_handle_mb curves"
"$BIN/pt-expand-model" "$TRACES" >"$OUT/pt-expandable.txt"
step "RAPIDS RMM's pool_memory_resource (model)"
rmm_args=("$TRACES")
if [ -d "$BUILD/traces" ]; then rmm_args+=("$BUILD/traces"); fi
"$BIN/rmm-pool-model" "${rmm_args[@]}" >"$OUT/rmm-pool.txt"
for f in $GROW; do
  "$BUILD/bin/tally-replay" --reps 1 --quiet --conf "expandable_segments:true,expandable_grow_chunk_mb:$f" "$TRACES" \
    >"$OUT/grow-chunk-$f.txt"
done
for h in $HANDLE; do
  "$BUILD/bin/tally-replay" --reps 1 --quiet --conf "expandable_segments:true,expandable_handle_mb:$h" "$TRACES" \
    >"$OUT/handle-$h.txt"
done
step "driver cost of the replays: the cuda backend on the CUDA stand-in, with its cost table"
# Quick mode: the recorded traces only (the synthetic ones take 24 s with expandable segments).
cost_args=("${replay_args[@]}")
[ $quick = 0 ] || cost_args=("$TRACES")
LD_LIBRARY_PATH="$BUILD/standin" "$BUILD/bin/tally-driver-cost" --table "${cost_args[@]}" >"$OUT/driver-cost-default.txt"
LD_LIBRARY_PATH="$BUILD/standin" "$BUILD/bin/tally-driver-cost" --table --conf expandable_segments:true "${cost_args[@]}" \
  >"$OUT/driver-cost-expandable.txt"
step "expandable segments step by step (tally-steps on the stand-in)"
LD_LIBRARY_PATH="$BUILD/standin" CUDA_STANDIN_DEVICES=1 CUDA_STANDIN_MEMORY=80G \
  TALLY_CONF=backend:cuda,leak_report:off,expandable_segments:true "$BIN/tally-steps" "${replay_args[@]}" \
  >"$OUT/steps-expandable.txt"
step "empty_cache mid-trace: what stays mapped, against PyTorch's expandable segments (tally-empty-cache)"
LD_LIBRARY_PATH="$BUILD/standin" CUDA_STANDIN_DEVICES=1 CUDA_STANDIN_MEMORY=80G \
  TALLY_CONF=backend:cuda,leak_report:off,expandable_segments:true "$BIN/tally-empty-cache" "${replay_args[@]}" \
  >"$OUT/empty-cache.txt"
step "hot path through PyTorch's entry points (batch of 64) against mimalloc"
"$BIN/torchpath-mimalloc" "${TORCH_QUICK[@]}" >"$OUT/torchpath.txt"
"$BIN/torchpath-mimalloc" "${TORCH_QUICK[@]}" --conf ledger:false | sed 's/^T pattern \([^ ]*\)/T pattern \1 (ledger off)/' >>"$OUT/torchpath.txt"
step "threads taking turns on one device: the device lock's bias on and off (bench/turns.c)"
"$BIN/turns" "${TURNS_QUICK[@]}" >"$OUT/turns.txt"
step "tally tune: speed, and the cost of trace:true (bench/tune.sh)"
bash "$HERE/tune.sh" "$BUILD" "$OUT" >"$OUT/tune.md"
# 4. Instruction counts (noise-free), when valgrind is installed.
if [ "${TALLY_BENCH_CALLGRIND:-1}" != 0 ] && command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null; then
  step "instruction counts (callgrind)"
  bash "$HERE/callgrind.sh" "$BUILD" >"$OUT/instructions.txt"
fi
end=$(date +%s)

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
# A virtual machine's model name may say only "AMD EPYC": the family and
# model say which generation, and the hot path's ratio to mimalloc moves
# with it (docs/benchmarks.md, run AB: 1.97x on one VM, 2.23x on a Zen 4 one).
family=$(awk -F': *' '$1 ~ /^cpu family/ { print $2; exit }' /proc/cpuinfo)
model=$(awk -F': *' '$1 ~ /^model[ \t]*$/ { print $2; exit }' /proc/cpuinfo)
l2=$(cat /sys/devices/system/cpu/cpu0/cache/index2/size 2>/dev/null || true)
[ -z "$family" ] || cpu="${cpu:-unknown CPU} (family $family, model ${model:-?}${l2:+, L2 $l2 per core})"
echo "# tally benchmarks"
echo
[ $quick = 0 ] || echo "- QUICK MODE (bash bench/run.sh --quick): every program ran on a small budget; the figures are not measurements."
echo "- machine: ${cpu:-unknown CPU}, $(nproc) CPUs, $(uname -sr)"
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
echo "- traces: $TRACES"
grep -h '^# system allocator' "$OUT"/hotpath-*.txt | sed 's/^# /- /'
grep -h '^# sizes' "$OUT/hotpath-glibc.txt" | sed 's/^# /- /'
grep -h '^# window' "$OUT/hotpath-glibc.txt" | sed 's/^# /- hot path: /'
echo

cat "$OUT"/hotpath-*.txt "$OUT"/ledger-*.txt "$OUT/backtrace.txt" | grep '^R ' | awk '
function median(key,    n, i, j, t, a) {
  n = cnt[key]
  if (n == 0) return -1
  for (i = 1; i <= n; i++) a[i] = val[key, i]
  for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function fmt(x) { return x < 0 ? "-" : sprintf("%.1f", x) }
function rat(a, b) { return (a < 0 || b <= 0) ? "-" : sprintf("%.2f", a / b) }
{
  key = $2 SUBSEP $3 SUBSEP $4 SUBSEP $5
  cnt[key]++; val[key, cnt[key]] = $6
  cnt["w" key]++; val["w" key, cnt["w" key]] = $10
  if ($9 + 0 > 0) grew[$2 " " $3 " " $4 " " $5 " threads"] = $9
}
END {
  ns = split("small all", S, " "); np = split("pair fifo lifo", P, " "); nt = split("1 8", T, " ")
  sname["small"] = "<= 256 KiB"; sname["all"] = "all sizes"
  print "## Hot path: CPU ns per allocate+free pair (median)"
  print ""
  print "CPU time of all threads / pairs of all threads. tally: median of its runs in the three processes; each ratio uses the tally run of the same process."
  print ""
  print "| sizes | pattern | threads | glibc | jemalloc | mimalloc | tally | tally/glibc | tally/jemalloc | tally/mimalloc |"
  print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (s = 1; s <= ns; s++) for (p = 1; p <= np; p++) for (t = 1; t <= nt; t++) {
    k = SUBSEP S[s] SUBSEP P[p] SUBSEP T[t]
    g = median("glibc" k); j = median("jemalloc" k); m = median("mimalloc" k)
    tg = median("tally@glibc" k); tj = median("tally@jemalloc" k); tm = median("tally@mimalloc" k)
    c = 0; delete tv
    if (tg >= 0) tv[++c] = tg; if (tj >= 0) tv[++c] = tj; if (tm >= 0) tv[++c] = tm
    for (i = 1; i <= c; i++) { cnt["_t" k]++; val["_t" k, cnt["_t" k]] = tv[i] }
    tal = median("_t" k)
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sname[S[s]], P[p], T[t], fmt(g), fmt(j), fmt(m), fmt(tal), rat(tg, g), rat(tj, j), rat(tm, m)
    if (S[s] == "small") {
      r = (tm > 0 && m > 0) ? tm / m : -1
      head[T[t]] = head[T[t]] sprintf("%s %s, ", P[p], rat(tm, m))
      if (r > 0) { lg[T[t]] += log(r); ln[T[t]]++ }
    }
  }
  print ""
  for (t = 1; t <= nt; t++) if (ln[T[t]])
    printf "Headline, sizes <= 256 KiB, %s thread%s: tally/mimalloc %sgeometric mean %.2f (target <= 2)\n", T[t], T[t] == 1 ? "" : "s", head[T[t]], exp(lg[T[t]] / ln[T[t]])
  print ""
  print "## Hot path, sizes <= 256 KiB: wall-clock ns per pair (median)"
  print ""
  print "Wall time / pairs of all threads (inverse throughput, waiting included). With more threads than CPUs, waiting for a CPU is included too."
  print ""
  print "| pattern | threads | glibc | jemalloc | mimalloc | tally | tally/mimalloc |"
  print "|---|---:|---:|---:|---:|---:|---:|"
  for (p = 1; p <= np; p++) for (t = 1; t <= nt; t++) {
    k = SUBSEP "small" SUBSEP P[p] SUBSEP T[t]
    g = median("wglibc" k); j = median("wjemalloc" k); m = median("wmimalloc" k)
    tg = median("wtally@glibc" k); tj = median("wtally@jemalloc" k); tm = median("wtally@mimalloc" k)
    c = 0; delete tv
    if (tg >= 0) tv[++c] = tg; if (tj >= 0) tv[++c] = tj; if (tm >= 0) tv[++c] = tm
    for (i = 1; i <= c; i++) { cnt["_w" k]++; val["_w" k, cnt["_w" k]] = tv[i] }
    printf "| %s | %s | %s | %s | %s | %s | %s |\n", P[p], T[t], fmt(g), fmt(j), fmt(m), fmt(median("_w" k)), rat(tm, m)
  }
  print ""
  print "## Hot path: tally ledger on / off, backtraces (CPU ns per pair, median)"
  print ""
  print "Ledger on and off: three alternated processes each. Backtrace cost per allocation = backtrace_depth:16 minus ledger on."
  print ""
  print "| sizes | pattern | threads | ledger on | ledger off | on/off | backtrace_depth:16 | backtrace cost per allocation |"
  print "|---|---|---:|---:|---:|---:|---:|---:|"
  for (s = 1; s <= ns; s++) for (p = 1; p <= np; p++) for (t = 1; t <= nt; t++) {
    k = SUBSEP S[s] SUBSEP P[p] SUBSEP T[t]
    on = median("ledger-on" k); off = median("ledger-off" k); bt = median("bt16" k)
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", sname[S[s]], P[p], T[t], fmt(on), fmt(off), rat(on, off), fmt(bt), (bt >= 0 && on >= 0) ? sprintf("%.0f ns", bt - on) : "-"
    if (S[s] == "small" && on > 0 && off > 0) { lo[T[t]] += log(on / off); lon[T[t]]++ }
  }
  print ""
  for (t = 1; t <= nt; t++) if (lon[T[t]])
    printf "Ledger on/off, sizes <= 256 KiB, %s thread%s: geometric mean %.3f over the three patterns (target <= 1.10)\n", T[t], T[t] == 1 ? "" : "s", exp(lo[T[t]] / lon[T[t]])
  n = 0
  for (x in grew) gl[++n] = x
  for (i = 2; i <= n; i++) { t = gl[i]; for (j = i - 1; j >= 1 && gl[j] > t; j--) gl[j + 1] = gl[j]; gl[j + 1] = t }
  if (n) {
    print ""
    printf "Backend allocations tally made while timed (its cache was not yet in a steady state):"
    for (i = 1; i <= n; i++) printf "%s %s: %s", i == 1 ? "" : ";", gl[i], grew[gl[i]]
    print ""
  }
}'
echo
echo "## Allocation sites: unwinding at depth 16 (bench/unwind.c, 1 thread, 4 KiB pairs 16 frames below main)"
echo
cat "$OUT/unwind.txt"
echo
echo "## Allocation sites: python_stack:8 from a Python loop (bench/pystack.py, ctypes, 8 frames deep)"
echo
cat "$OUT/pystack.txt"
echo
echo "## Hot path: instructions per pair (callgrind, 1 thread, sizes <= 256 KiB)"
echo
if [ -s "$OUT/instructions.txt" ]; then
  echo "Counted with callgrind (inclusive instructions of the pattern loop, per allocate+free pair): unlike time, not moved by other load on the machine."
  echo
  cat "$OUT/instructions.txt"
else
  echo "Not measured (valgrind not installed, or TALLY_BENCH_CALLGRIND=0)."
fi
echo
echo "## Replay (PyTorch's placement rules, the default)"
echo
cat "$OUT/replay.txt"
echo
echo "## Replay with expandable_segments:true (one address range per stream, 2 MiB pages mapped on demand)"
echo
cat "$OUT/replay-expandable.txt"
echo
echo "## Driver cost per recorded trace: the cuda backend on the CUDA stand-in"
echo
echo "Each trace replayed once through backend:cuda on the stand-in (bench/driver_cost.c), every driver call counted"
echo "per entry point (cuMemSetAccess and cuMemUnmap with the mappings they touch, in brackets), and the modelled"
echo "driver time from the stand-in's cost table (tests/standin/cost.c: A100 and Blackwell columns, per call or per"
echo "mapping, each figure with its source or stated assumption; docs/benchmarks.md prints the table)."
echo "\"all driver calls\" includes the context, stream and event calls outside the columns."
echo
echo "### PyTorch's placement (default)"
echo
cat "$OUT/driver-cost-default.txt"
echo
echo "### expandable_segments:true"
echo
cat "$OUT/driver-cost-expandable.txt"
echo
echo "## Expandable segments: memory, backend calls and CUDA driver calls per recorded trace"
echo
# Per-call costs for the GPU-time estimate, in microseconds (docs/benchmarks.md
# says where they come from): cuMemAlloc / cuMemFree of a segment; any other
# driver call of the virtual memory API (cuMemCreate, cuMemMap, cuMemRelease,
# cuMemSetAccess, cuMemUnmap, cuMemAddressReserve); the synchronise before an
# unmap on an idle device (waiting for queued work is not counted).
US_ALLOC=50 US_VMM=20 US_SYNC=20
echo "Backend calls (the backend contract): default = segment allocations + frees; tally expandable = map + unmap calls"
echo "+ small-pool segment allocations + frees; PyTorch expandable (bench/pt_expand.c, a model of its placement) = map calls"
echo "(it unmaps only at empty_cache / OOM). CUDA driver calls, as the code makes them: default 1 per cuMemAlloc / cuMemFree;"
echo "tally expandable (lib/backend/cuda/vmm.c) 3h + 1 to map h physical handles (one per 2 MiB page, one per run of new pages for"
echo "blocks >= expandable_handle_mb), 1 cuStreamSynchronize (the segment's stream) + 1 cuMemUnmap per run to unmap,"
echo "1 per range reserved; PyTorch expandable (ExpandableSegment) 2n + 1 to map n pages (2 MiB small pool, 20 MiB large),"
echo "1 per range reserved. Estimated GPU time (assumed costs, not measured on a GPU: cuMemAlloc or cuMemFree ${US_ALLOC} us,"
echo "each other driver call ${US_VMM} us, a synchronise on an idle device ${US_SYNC} us; see docs/benchmarks.md)."
echo
awk -F'|' -v ua="$US_ALLOC" -v uv="$US_VMM" -v us="$US_SYNC" '
FILENAME ~ /replay.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); dr[t]=$7+0; dc[t]=$8+$9; dd[t]=$22+0; pr[t]=$13; gsub(/ /,"",pr[t]); order[++n]=t }
FILENAME ~ /replay-expandable.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); er[t]=$7+0; ec[t]=$8+$9; eseg[t]=$15+0; eu[t]=$18+0; ed[t]=$22+0 }
FILENAME ~ /pt-expandable.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); mr[t]=$5+0; mc[t]=$6+0; md[t]=$9+0 }
function x(a, b) { return b > 0 ? sprintf("%.1f", a / b) : "-" }
END {
  print "| trace | res/live default | tally exp. | PyTorch exp. | backend calls default | tally exp. | PyTorch exp. | driver calls default | tally exp. | PyTorch exp. | est. GPU ms default / tally exp. / PyTorch exp. | PyTorch default res/live (reference.json) |"
  print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for (i = 1; i <= n; i++) { t = order[i]; if (!(t in er) || !(t in mr)) continue
    dms = dd[t] * ua / 1000; ems = (eseg[t] * ua + (ed[t] - eseg[t] - eu[t]) * uv + eu[t] * us) / 1000; mms = md[t] * uv / 1000
    printf "| %s | %.3f | %.3f | %.3f | %d | %d (%sx) | %d (%sx) | %d | %d (%sx) | %d (%sx) | %.1f / %.1f / %.1f | %s |\n", t, dr[t], er[t], mr[t], dc[t], ec[t], x(ec[t], dc[t]), mc[t], x(mc[t], dc[t]), dd[t], ed[t], x(ed[t], dd[t]), md[t], x(md[t], dd[t]), dms, ems, mms, pr[t]
    k++; sdr += dr[t]; ser += er[t]; smr += mr[t]; sdc += dc[t]; sec += ec[t]; smc += mc[t]; sdd += dd[t]; sed += ed[t]; smd += md[t]
    sdms += dms; sems += ems; smms += mms
    if (dc[t] > 0 && ec[t] / dc[t] > worst) { worst = ec[t] / dc[t]; wt = t }
    if (dd[t] > 0 && ed[t] / dd[t] > dworst) { dworst = ed[t] / dd[t]; dwt = t }
  }
  if (k) {
    printf "| **sum of %d traces** | %.4f (mean) | %.4f | %.4f | %d | %d (%sx) | %d (%sx) | %d | %d (%sx) | %d (%sx) | %.1f / %.1f / %.1f | |\n", k, sdr / k, ser / k, smr / k, sdc, sec, x(sec, sdc), smc, x(smc, sdc), sdd, sed, x(sed, sdd), smd, x(smd, sdd), sdms, sems, smms
    printf "\nMeans over %d traces: res/live default %.4f, tally expandable %.4f (goal <= 1.01), PyTorch expandable model %.4f.\n", k, sdr / k, ser / k, smr / k
    printf "Backend calls summed: default %d, tally expandable %d = %.2fx default (goal <= 2x; worst trace %s at %.1fx, goal <= 5x), PyTorch expandable model %d = %.2fx.\n", sdc, sec, sdc ? sec / sdc : 0, wt, worst, smc, sdc ? smc / sdc : 0
    printf "CUDA driver calls summed: default %d, tally expandable %d = %.1fx default (worst trace %s at %.1fx), PyTorch expandable model %d = %.1fx; tally / PyTorch expandable %.1fx.\n", sdd, sed, sdd ? sed / sdd : 0, dwt, dworst, smd, sdd ? smd / sdd : 0, smd ? sed / smd : 0
  }
}' "$OUT/replay.txt" "$OUT/replay-expandable.txt" "$OUT/pt-expandable.txt"
echo
echo "### RAPIDS RMM's pool_memory_resource (bench/rmm_pool.c, a model of its placement and growth: tools/rmm_pool.c)"
echo
echo "Grown: no initial pool, no maximum (each growth asks for the pool's size again). Least: the least pool, on a 2 MiB grid, that serves the trace when made at the start."
echo
cat "$OUT/rmm-pool.txt"
echo
echo "### expandable_grow_chunk_mb: the trade-off (recorded traces, 1 repetition; 20 is the default)"
echo
echo "| expandable_grow_chunk_mb | mean res/live | backend calls (sum) | x default calls | worst trace x default | CUDA driver calls (sum) | x default driver calls |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
for f in $GROW; do
  awk -F'|' -v f="$f" '
  FILENAME ~ /replay.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); dc[t]=$8+$9; dd[t]=$22 }
  FILENAME !~ /replay.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); if (!(t in dc)) next; n++; r+=$7; c=$8+$9; sc+=c; sd+=dc[t]; sx+=$22; sdd+=dd[t]; if (dc[t] && c/dc[t] > w) w=c/dc[t] }
  END { if (n) printf "| %s | %.4f | %d | %.2f | %.1f | %d | %.1f |\n", f, r/n, sc, sd ? sc/sd : 0, w, sx, sdd ? sx/sdd : 0 }' "$OUT/replay.txt" "$OUT/grow-chunk-$f.txt"
done
echo
echo "### expandable_handle_mb: the trade-off (recorded traces, 1 repetition; 64 is the default, 0 a handle per 2 MiB page)"
echo
echo "| expandable_handle_mb | mean res/live | worst trace res/live | backend calls (sum) | CUDA driver calls (sum) | x default driver calls |"
echo "|---:|---:|---:|---:|---:|---:|"
for h in $HANDLE; do
  awk -F'|' -v h="$h" '
  FILENAME ~ /replay.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); dd[t]=$22 }
  FILENAME !~ /replay.txt$/ && /\.csv/ { t=$2; gsub(/ /,"",t); if (!(t in dd)) next; n++; q=$6/$5; r+=q; if (q > w) { w=q; wt=t }
    sc+=$8+$9; sx+=$22; sdd+=dd[t] }
  END { if (n) printf "| %s | %.4f | %.4f (%s) | %d | %d | %.1f |\n", h, r/n, w, wt, sc, sx, sdd ? sx/sdd : 0 }' "$OUT/replay.txt" "$OUT/handle-$h.txt"
done
echo
echo "## Expandable segments step by step (bench/steps.c on the CUDA stand-in)"
echo
echo "Each trace split into steps (the period of its allocation sizes); memory driver calls (create, map, set-access,"
echo "release, unmap, segment alloc/free, the synchronise before an unmap) and their modelled time per steady step"
echo "(the mean over the whole steps after the first) and over the whole trace, expandable_segments:true with the"
echo "default expandable_move_budget (0: idle pages never move). Captures announced, as under tally.install()."
echo
echo "| trace | peak live MiB | peak reserved MiB | res/live | memory calls per steady step | backend calls per steady step | A100 ms per steady step | Blackwell ms per steady step | memory calls, whole trace | A100 ms, whole trace | Blackwell ms, whole trace |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
grep '^  summary |' "$OUT/steps-expandable.txt" | sed 's/^  summary //'
echo
echo "## Expandable segments: what empty_cache leaves mapped mid-trace (bench/empty_cache.c on the CUDA stand-in)"
echo
echo "Each trace cut at 10%, 20%, ... 90% of its events; a fresh replay to the cut, then empty_cache: the reserved"
echo "bytes left, summed over the cuts, against the model of PyTorch's expandable segments (20 MiB handles) with"
echo "an empty_cache at the same point. A live block keeps its whole physical handle mapped."
echo
cat "$OUT/empty-cache.txt"
echo
echo "## Hot path through PyTorch's entry points (tally_torch_alloc / tally_torch_free against mimalloc)"
echo
echo "Batches of 64 allocations freed in a scattered order, 256 fixed batches per pattern; CPU ns per pair, median of 15"
echo "repetitions, ledger on, then off. Patterns (bench/torchpath.c): loguniform (1 B to 192 KiB, half the sizes under 600 B),"
echo "mix16 (16 fixed sizes from 4 B to 192 KiB, mostly 512 B to 64 KiB), mix512-64k (16 fixed sizes, all 512 B to 64 KiB:"
echo "the goal, ratio <= 2, is stated on this one), small4k (1 B to 4 KiB)."
echo
echo '```'
cat "$OUT/torchpath.txt"
echo '```'
echo
echo "## Threads taking turns on one device (bench/turns.c): the device lock's bias"
echo
echo "Two threads take turns on device 0 (host backend), P allocate+free pairs a turn (batches of 16, 512 B to 64 KiB);"
echo "wall ns per pair, median of 5 runs each in a fresh process, lock_bias:true then false; biases granted and revoked"
echo "with it on. P = 1: the bias is never earned; P = 2^20: one thread at a time (docs/architecture.md, the device lock)."
echo
echo '```'
cat "$OUT/turns.txt"
echo '```'
echo
cat "$OUT/tune.md"
echo
echo "## Sleep and wake of a private tag (bench/sleep.c, docs/sleep.md)"
echo
echo "64 MiB blocks under one private tag. Host backend: wall time, real copies. cuda on the stand-in: driver calls"
echo "counted, time modelled with the cost table (tests/standin/cost.c), copies and pinning from its per-MiB rows;"
echo "vLLM's CuMemAllocator (a handle per allocation) modelled on the same table."
echo
echo '```'
for g in 1 4; do "$BUILD/bin/tally-sleep-bench" host "$g"; done
for g in 10 40; do
  CUDA_STANDIN_MEMORY=$((g + 8))G LD_LIBRARY_PATH="$BUILD/standin" "$BUILD/bin/tally-sleep-bench" cuda "$g"
done
echo '```'
echo
echo "Raw results: $OUT. Wall time of the run: $((end - start)) s."
