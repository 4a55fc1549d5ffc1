#!/usr/bin/env bash
# make demo's program on the host backend: it says what the user is looking
# at and what to try next, its stages take real time, and TALLY_CONF wins
# over the demo's own settings (leak_report:off silences the leak report,
# persistent_tags:weights makes the optimizer state a stage survivor), and
# a bad TALLY_CONF is one line. At exit the planted leak is the only one,
# and no free was refused.
# Prints "ok CHECK" or "FAIL CHECK: why" per check (tests/run.sh counts them).
set -u
. "$(dirname "$0")/checkutil.sh"
demo=$root/${BUILD:-build}/bin/demo
# has CHECK FILE PATTERN: a line of FILE matches the extended regex.
has() { grep -Eq -- "$3" "$2" && ok "$1" || bad "$1" "no line matching '$3' in $(basename "$2"): $(head -c 3000 "$2")"; }
lacks() { grep -Eq -- "$3" "$2" && bad "$1" "a line matches '$3' in $(basename "$2")" || ok "$1"; }

TALLY_CONF=backend:host "$demo" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && ok "demo runs" || bad "demo runs" "$(tail -3 "$tmp/err")"
has "names the planted leak" "$tmp/out" 'second copy \(tag model-init\) that is never freed: the leak planted'
has "says which tags are persistent" "$tmp/out" '^weights and optimizer are persistent tags'
has "says which keys it sets" "$tmp/out" '^Settings: persistent_tags:weights\|optimizer,release_at_stage_end:true,leak_report:full \(TALLY_CONF overrides any of them\)'
has "explains home device none" "$tmp/out" '"home device none": no device is this'
has "suggests next steps" "$tmp/out" "TALLY_CONF=report_path:${BUILD:-build}/demo/demo.json,timeline:true ${BUILD:-build}/bin/demo"
has "suggests tally plot" "$tmp/out" "${BUILD:-build}/bin/tally plot ${BUILD:-build}/demo/demo.json -o ${BUILD:-build}/demo/demo.html"
has "stages take real time" "$tmp/err" '^tally: stage train ended after (0\.(1[5-9]|[2-9][0-9])[0-9]|[1-9][0-9]*\.[0-9]{3}) s'
lacks "no stage of 0 s" "$tmp/out" '^[0-9]+ +(load|train|eval) +0\.000 '
has "leak report at exit" "$tmp/err" '^tally: 71644160 bytes \(68\.3 MiB\) in 24 blocks: tag model-init, stage load, device 0$'
has "the planted leak is the only one" "$tmp/err" '^tally: SUMMARY: 71644160 bytes leaked in 24 blocks$'
lacks "every other block freed once" "$tmp/err" 'tally_free'
# The summary counts the demo's workload, as tools/demo.c makes it: load 2 x
# (12 weights + 12 biases) + the staging buffer = 49; train 20 steps x (12
# activations + 12 gradients) + 24 optimizer blocks = 504; eval 5 passes x 2
# = 10: 563 allocations, 491 freed (the staging buffer, activations,
# gradients and eval's), 72 live at the end (the two models, the optimizer).
has "summary counts the demo's allocations" "$tmp/out" '^\| Allocations +\| +72 +\| +85 +\| +563 +\| +491 +\|$'

# Both streams into one pipe, as a terminal or `make demo | less` shows them:
# stdout is line-buffered, so the intro comes before the first stage line
# and the memory summary (printed after the stages) after the last one.
TALLY_CONF=backend:host "$demo" 2>&1 | cat >"$tmp/both"
intro_at=$(grep -n -m1 '^What runs' "$tmp/both" | cut -d: -f1)
stage_at=$(grep -n -m1 '^tally: stage load ended' "$tmp/both" | cut -d: -f1)
last_stage_at=$(grep -n '^tally: stage eval released' "$tmp/both" | cut -d: -f1)
summary_at=$(grep -n -m1 'PyTorch CUDA memory summary' "$tmp/both" | cut -d: -f1)
if [ -n "$intro_at" ] && [ -n "$stage_at" ] && [ -n "$last_stage_at" ] && [ -n "$summary_at" ] &&
   [ "$intro_at" -lt "$stage_at" ] && [ "$last_stage_at" -lt "$summary_at" ]; then
  ok "stdout and stderr interleave in order"
else
  bad "stdout and stderr interleave in order" "intro at line ${intro_at:-none}, first stage line ${stage_at:-none}, last ${last_stage_at:-none}, summary ${summary_at:-none}"
fi

TALLY_CONF=backend:host,leak_report:off,persistent_tags:weights "$demo" >"$tmp/out" 2>"$tmp/err"
lacks "TALLY_CONF leak_report:off wins" "$tmp/err" 'leak report|SUMMARY'
has "TALLY_CONF persistent_tags wins" "$tmp/err" '^tally: stage train ended with 136\.5 MiB still live under tag optimizer'
TALLY_CONF=backend:host,leak_reprot:full "$demo" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && [ "$(cat "$tmp/err")" = "demo: TALLY_CONF: config: unknown key 'leak_reprot' (did you mean 'leak_report'?)" ]; then
  ok "a bad TALLY_CONF is one line"
else
  bad "a bad TALLY_CONF is one line" "exit $rc, stderr: $(cat "$tmp/err")"
fi
# Run from another folder, the demo's next steps name absolute paths and
# work there as printed; their files go to the build folder's demo/ (git
# ignores build folders), none to the folder they ran in.
mkdir "$tmp/elsewhere"
rm -rf "$root/${BUILD:-build}/demo"
(cd "$tmp/elsewhere" && TALLY_CONF=backend:host "$demo" >"$tmp/out2" 2>/dev/null)
# The demo makes that folder itself, with the user's umask: one the user
# could not write into would fail every next step (root writes anyway).
mode=$(stat -c %a "$root/${BUILD:-build}/demo" 2>/dev/null)
want=$(printf '%o' $((0777 & ~$(umask))))
[ "$mode" = "$want" ] && ok "the demo makes its folder with the umask's mode" ||
  bad "the demo makes its folder with the umask's mode" "mode '${mode:-no folder}', want $want"
grep -E '^  (TALLY_CONF=|/.*/bin/tally |PYTHONPATH=)' "$tmp/out2" | sed 's/   *(.*$//' >"$tmp/steps"
[ "$(wc -l <"$tmp/steps")" -eq 4 ] && ok "next steps outside the repo: four commands" ||
  bad "next steps outside the repo: four commands" "$(cat "$tmp/out2" | tail -8)"
grep -q "$root/${BUILD:-build}/demo/demo.json" "$tmp/steps" && ok "next steps write to the build folder" ||
  bad "next steps write to the build folder" "$(cat "$tmp/steps")"
rm -f "$root/${BUILD:-build}/demo/demo.json" "$root/${BUILD:-build}/demo/demo.html" "$root/${BUILD:-build}/demo/demo.pickle"
n=0
while IFS= read -r step; do
  n=$((n + 1))
  case $step in PYTHONPATH=*) command -v python3 >/dev/null 2>&1 || { skip "next step $n" "python3 is not installed"; continue; } ;; esac
  if (cd "$tmp/elsewhere" && env -u TALLY_LIB bash -c "$step" >"$tmp/step.out" 2>&1); then ok "next step $n runs outside the repo"
  else bad "next step $n runs outside the repo" "$step: $(tail -3 "$tmp/step.out")"; fi
done <"$tmp/steps"
[ -z "$(ls -A "$tmp/elsewhere")" ] && ok "next steps leave nothing where they ran" ||
  bad "next steps leave nothing where they ran" "$(ls "$tmp/elsewhere")"
for f in demo.json demo.html; do
  [ -s "$root/${BUILD:-build}/demo/$f" ] && ok "next steps wrote ${BUILD:-build}/demo/$f" || bad "next steps wrote ${BUILD:-build}/demo/$f" "absent"
done
exit $failed
