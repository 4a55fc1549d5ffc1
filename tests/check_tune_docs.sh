#!/usr/bin/env bash
# docs/tune.md's generated blocks (between <!-- tune_docs: NAME --> markers)
# equal what tally tune prints now: tools/tune_docs.py --check reruns the
# commands they quote. A second check shows the first can fail: a copy of
# the page with one figure changed must be reported, naming its block.
# Needs build/bin/tally, python3 and ../shared/traces (skips without them).
set -u
. "$(dirname "$0")/checkutil.sh"
cd "$root"
if ! command -v python3 >/dev/null 2>&1; then
  skip tune_docs "python3 is not installed"
elif [ ! -f ../shared/traces/reference.json ]; then
  skip tune_docs "../shared/traces is not beside the repository"
elif [ ! -x build/bin/tally ]; then
  bad tune_docs "build/bin/tally is missing (make builds it)"
else
  if out=$(python3 tools/tune_docs.py --check 2>&1); then
    ok "tune_docs: docs/tune.md's generated blocks equal the command's output"
  else
    bad tune_docs "$out"
  fi
  # The same check on a page with one figure of the accuracy table changed.
  sed 's/| 4042.0 | 4042.0 |/| 4042.0 | 4041.0 |/' docs/tune.md >"$tmp/tune.md"
  if cmp -s docs/tune.md "$tmp/tune.md"; then
    bad tune_docs_can_fail "the probe's edit did not apply (the accuracy table changed shape?)"
  elif out=$(python3 tools/tune_docs.py --check --doc "$tmp/tune.md" 2>&1); then
    bad tune_docs_can_fail "a changed figure went unnoticed"
  elif [[ $out == *accuracy* ]]; then
    ok "tune_docs_can_fail: a changed figure is reported ($out)"
  else
    bad tune_docs_can_fail "unexpected output: $out"
  fi
fi
exit $failed
