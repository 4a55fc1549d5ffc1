#!/usr/bin/env bash
# The figures the docs quote, regenerated from the program and compared
# (tests/docs_figures.py: docs/tune.md's examples, accuracy table, grid size
# and make bench figures). A doc that no longer matches its program fails,
# naming the figure and the first line that differs;
# `python3 tests/docs_figures.py --update` rewrites the generated regions.
# Prints "ok NAME", "FAIL NAME: why" or "SKIP NAME: why" per figure.
set -u
. "$(dirname "$0")/checkutil.sh"
if ! command -v python3 >/dev/null 2>&1; then
  skip "docs figures" "python3 is not installed"
  exit 0
fi
BUILD=${BUILD:-build} python3 "$root/tests/docs_figures.py" --check
