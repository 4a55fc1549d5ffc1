# Sourced by the check scripts (tests/check_*.sh): the repository root, a
# temporary directory removed at exit, and the lines tests/run.sh counts.
#   ok CHECK            "ok CHECK"
#   bad CHECK WHY       "FAIL CHECK: WHY", and the script will exit 1
#   skip CHECK WHY      "SKIP CHECK: WHY"
# The script ends with `exit $failed`.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tally-check-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
failed=0
ok() { echo "ok $1"; }
bad() { echo "FAIL $1: $2"; failed=1; }
skip() { echo "SKIP $1: $2"; }
