#!/usr/bin/env python3
"""The blind candidates no test reaches (run by `make coverage`).

    unexecuted.py BUILD [OUT.tsv]

BUILD is a build made with gcov instrumentation on which `make test` ran
(`make coverage` makes build-cov). Every .gcda file under it is read with
`gcov --json-format --stdout`, and a source line counts as run when any
program ran it (a library file is compiled into the library, the fuzz
replays and the test binaries; a tools/ file into the CLI and some tests).
Then every candidate of tests/mutate/blind.py (--all) is placed:

  run          on a line some test ran
  never run    on a line that has code but that no test ran: a mutant there
               survives whatever it changes, so each is a test to write
  no code      on a line gcov gives no count (a declaration, an
               initialiser, a file-scope constant)
  python       in python/ (gcov sees C only)

It prints the totals, then the files and functions with candidates that
are never run, most first, and writes those candidates to OUT.tsv (default
BUILD/unexecuted.tsv) in blind.py's format, ready for
MUTATE_BLIND_FILE=OUT.tsv MUTATE_SCREEN=1 bash tests/mutate/mutate.sh.
"""

import collections
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import blind  # noqa: E402


def line_counts(build):
    """{source: (lines run, lines with a count)} over every .gcda in build."""
    run = collections.defaultdict(set)
    counted = collections.defaultdict(set)
    files = glob.glob(os.path.join(build, "**", "*.gcda"), recursive=True)
    for gcda in files:
        out = subprocess.run(["gcov", "--json-format", "--stdout", gcda], cwd=ROOT,
                             capture_output=True, text=True).stdout
        for text in out.splitlines():
            try:
                data = json.loads(text)
            except ValueError:
                continue
            for f in data.get("files", []):
                name = os.path.normpath(f["file"])
                for line in f["lines"]:
                    counted[name].add(line["line_number"])
                    if line["count"] > 0:
                        run[name].add(line["line_number"])
    return files, run, counted


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    build = argv[1]
    out_path = argv[2] if len(argv) == 3 else os.path.join(build, "unexecuted.tsv")
    gcdas, run, counted = line_counts(build)
    if not gcdas:
        sys.stderr.write(f"unexecuted.py: no .gcda file under {build}: run `make coverage` first\n")
        return 1
    totals = collections.Counter()
    by_file = collections.Counter()
    by_function = collections.Counter()
    never = []
    for c in blind.all_candidates(ROOT):
        rel, line = c[0], int(c[1])
        if rel.endswith(".py"):
            totals["python"] += 1
        elif line in run.get(rel, ()):
            totals["run"] += 1
        elif line in counted.get(rel, ()):
            totals["never run"] += 1
            by_file[rel] += 1
            by_function[(rel, c[5].rsplit(" in ", 1)[-1])] += 1
            never.append(c)
        else:
            totals["no code"] += 1
    with open(out_path, "w", encoding="utf-8") as out:
        for c in never:
            fields = [str(x) for x in c]
            if not any("\t" in f or "\n" in f for f in fields):
                out.write("\t".join(fields) + "\n")
    c_total = totals["run"] + totals["never run"] + totals["no code"]
    print(f"coverage: {len(gcdas)} .gcda files; {c_total} blind candidates in C: {totals['run']} on lines run, "
          f"{totals['never run']} on lines never run, {totals['no code']} on lines without a count; "
          f"{totals['python']} in python/ (not measured)")
    print("never run, by file:")
    for rel, n in by_file.most_common():
        print(f"  {n:5d}  {rel}")
    print("never run, by function (the first 30):")
    for (rel, fn), n in by_function.most_common(30):
        print(f"  {n:5d}  {rel} {fn}")
    print(f"coverage: the {totals['never run']} candidates never run are in {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
