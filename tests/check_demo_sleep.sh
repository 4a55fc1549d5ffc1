#!/usr/bin/env bash
# make demo-sleep's program (tools/demo_sleep.c): three cycles of two private
# tags sleeping (weights offloaded, the cache discarded) while a trainer uses
# the memory; every step's line, the stage reports naming what slept and
# woke, the ledger's private tags table, and the report's timeline drawn by
# tally plot with each sleep and wake.
# Prints "ok CHECK" or "FAIL CHECK: why" per check (tests/run.sh counts them).
set -u
. "$(dirname "$0")/checkutil.sh"
demo=$root/${BUILD:-build}/bin/demo-sleep
tally=$root/${BUILD:-build}/bin/tally
has() { grep -Eq -- "$3" "$2" && ok "$1" || bad "$1" "no line matching '$3' in $(basename "$2"): $(head -c 3000 "$2")"; }
count() { local n; n=$(grep -Ec -- "$3" "$2"); [ "$n" -eq "$4" ] && ok "$1" || bad "$1" "$n lines match '$3', expected $4"; }

TALLY_CONF= "$demo" "$tmp/demo-sleep.json" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && ok "demo-sleep runs" || bad "demo-sleep runs" "$(tail -3 "$tmp/err")"
count "each cycle gives the memory back" "$tmp/out" '^weights offloaded, cache discarded +reserved +0 MiB \| weights asleep .* offload 256 MiB \| kv_cache asleep' 3
count "the trainer fits while they sleep" "$tmp/out" '^trainer holds 640 MiB +reserved +640 MiB' 3
count "weights come back" "$tmp/out" '^woken: weights restored +reserved +512 MiB \| weights awake +mapped 256 MiB' 3
count "stage reports name the sleeps" "$tmp/err" '^tally: stage rollout-[123]: private tags weights slept \(offloaded to host\), kv_cache slept \(discarded\)$' 3
count "stage reports name the wakes" "$tmp/err" '^tally: stage train-[123]: private tags weights woke, kv_cache woke$' 3
has "the ledger's private tags table" "$tmp/out" '^0 +weights +awake +256\.0 MiB +0 B +0 +0 B +3 +3$'
# Every block the demo took is given back before exit: the report written
# at exit lists no live block.
has "nothing is left live at exit" "$tmp/demo-sleep.json" '"leaks":\[\]'
"$tally" plot "$tmp/demo-sleep.json" -o "$tmp/demo-sleep.svg" >/dev/null 2>"$tmp/plot.err"
[ $? -eq 0 ] && ok "tally plot reads the report" || bad "tally plot reads the report" "$(cat "$tmp/plot.err")"
count "tally plot marks each sleep" "$tmp/demo-sleep.svg" '<path class="sleep"' 6
count "tally plot marks each wake" "$tmp/demo-sleep.svg" '<path class="wake"' 6
exit $failed
