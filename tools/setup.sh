#!/usr/bin/env bash
# Installs the Debian packages tally needs to build, test and benchmark.
# Runs apt-get when root and something is missing; otherwise prints the exact
# command and fails. Called by make through a stamp file, so it runs once.
set -u
pkgs="build-essential libcmocka-dev libjemalloc-dev libmimalloc-dev python3 clang libdw1 libunwind8"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq $missing >/dev/null || {
    echo "setup: apt-get install$missing failed" >&2; exit 1; }
  exit 0
fi
echo "setup: missing Debian packages:$missing" >&2
echo "setup: run: sudo apt-get install -y$missing" >&2
exit 1
