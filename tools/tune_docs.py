#!/usr/bin/env python3
"""Regenerate the figures docs/tune.md quotes from tally tune's own runs.

Each generated block of docs/tune.md sits between
    <!-- tune_docs: NAME -->
and
    <!-- end tune_docs: NAME -->
and is rewritten from a run of build/bin/tally tune (on ../shared/traces
and on small traces written here), so the page and the command cannot
drift apart. Text outside the markers is left as it is.

    python3 tools/tune_docs.py            rewrite docs/tune.md
    python3 tools/tune_docs.py --check    exit 1, naming the blocks, if the
                                          page differs from the runs
    --doc PATH                            another copy of the page (tests)

Run from anywhere; paths are taken from the repository root. Standard
library only.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TALLY = os.path.join(ROOT, "build", "bin", "tally")
TRACES = "../shared/traces"  # as the page writes it, relative to the root
MIB = 1 << 20

SNAPSHOTS = [
    "gpt2-small-compiled-train",
    "opt125m-zeroth-order-finetune",
    "transformer-d768-l12-train",
    "transformer-forward-ctx128",
    "transformer-medium-ctx1024-train",
    "transformer-train-4steps-cold",
    "transformer-xl-forward-ctx512-expandable",
]
EXAMPLE = "gpt2-small-compiled-train"
THREE = "op,id,size,stream\na,1,31457280,0\na,2,1000,0\na,3,5242880,0\n"


def tune(*args):
    """tally tune -q ARGS from the root: (status, stdout, stderr)."""
    p = subprocess.run([TALLY, "tune", "-q", *args], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, TALLY_PYTHON="false"))
    return p.returncode, p.stdout, p.stderr


def block_example():
    path = f"{TRACES}/snapshots/{EXAMPLE}.pickle"
    rc, out, err = tune("--torch-version", "2.11", path)
    if rc:
        raise SystemExit(f"tune_docs: tally tune {path}: status {rc}: {err.strip()}")
    return f"`build/bin/tally tune -q --torch-version 2.11 {path}`:\n\n```\n{out.rstrip()}\n```\n"


def mib(b):
    return f"{b / MIB:.1f}"


def block_accuracy():
    with open(os.path.join(ROOT, TRACES, "reference.json")) as f:
        ref = {r["trace"]: r for r in json.load(f)}
    lines = [
        "| snapshot | recorded setting | PyTorch | replay from the recorded state | difference | replay from empty "
        "(same setting) | PyTorch's recommendation | MiB | tally's recommendation | MiB |",
        "|---|---|---:|---:|---:|---:|---|---:|---|---:|",
    ]
    for name in SNAPSHOTS:
        rc, out, err = tune("--json", f"{TRACES}/snapshots/{name}.pickle")
        if rc:
            raise SystemExit(f"tune_docs: {name}: status {rc}: {err.strip()}")
        rows = json.loads(out)
        first = rows[0]
        pt = ref[name + ".csv"]["pytorch_native_peak_reserved_bytes"]
        replay = first["recorded_replay_peak_reserved_bytes"]
        rec_pt = next(r for r in rows if r["recommended"])
        rec_t = next(r for r in rows if r["recommended_tally"])
        conf = next((r for r in rows if r["why"] == "the setting the job ran with"), None)
        setting = "" if conf is None else conf["setting"]
        if conf is None:
            # The grid holds the recorded setting: the row under PyTorch's rules.
            recorded = "expandable_segments:True" if "expandable" in name else ""
            conf = next(r for r in rows if r["setting"] == recorded and r["allocator"] != "tally")
            setting = recorded
        lines.append(
            f"| {name} | `{setting or '(default)'}` | {mib(pt)} | {mib(replay)} | {replay - pt:+d} B "
            f"({100.0 * (replay - pt) / pt:+.3f}%) | {mib(conf['peak_reserved_bytes'])} | "
            f"`{rec_pt['setting'] or '(default)'}` ({rec_pt['allocator']}) | {mib(rec_pt['peak_reserved_bytes'])} | "
            f"`{rec_t['setting'] or '(default)'}` | {mib(rec_t['peak_reserved_bytes'])} |")
    return ("`build/bin/tally tune -q --json` on each of `" + TRACES + "/snapshots`; PyTorch = "
            "`pytorch_native_peak_reserved_bytes` of reference.json; MiB unless marked:\n\n" + "\n".join(lines) + "\n")


def block_budgets():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "three.csv")
        with open(path, "w") as f:
            f.write(THREE)
        out = ["```", "$ cat three.csv", THREE.rstrip()]
        for args in (["--capacity", "30MiB"], ["--capacity", "1GiB", "--max-calls", "0"],
                     ["--capacity", "1GiB", "--max-driver-time", "0.5ms"]):
            rc, _, err = tune(*args, path)
            out.append(f"$ tally tune -q {' '.join(args)} three.csv >/dev/null; echo $?")
            out.append(err.rstrip().replace(path, "three.csv"))
            out.append(str(rc))
        rc, js, err = tune("--json", "--capacity", "1GiB", path)
        row = json.loads(js)[0]
        ro = row["runs_out"]
        out.append("$ tally tune -q --json --capacity 1GiB three.csv   # the default's row, in part")
        out.append(json.dumps({k: row[k] for k in ("setting", "allocator", "peak_reserved_bytes", "min_device_bytes",
                                                     "driver_us_a100", "driver_us_blackwell")} | {"runs_out": ro}))
        out.append("```")
        return "\n".join(out) + "\n"


BLOCKS = {"example": block_example, "accuracy": block_accuracy, "budgets": block_budgets}


def main(argv):
    check = "--check" in argv
    doc = os.path.join(ROOT, "docs", "tune.md")
    if "--doc" in argv:
        doc = argv[argv.index("--doc") + 1]
    if not os.access(TALLY, os.X_OK):
        raise SystemExit(f"tune_docs: {TALLY} is missing (make builds it)")
    with open(doc) as f:
        text = f.read()
    stale = []
    for name, make in BLOCKS.items():
        pat = re.compile(r"(<!-- tune_docs: %s -->\n)(.*?)(<!-- end tune_docs: %s -->)" % (name, name), re.S)
        m = pat.search(text)
        if not m:
            raise SystemExit(f"tune_docs: {doc} has no block '{name}' (<!-- tune_docs: {name} --> ... "
                             f"<!-- end tune_docs: {name} -->)")
        body = make()
        if m.group(2) != body:
            stale.append(name)
            text = text[:m.start(2)] + body + text[m.end(2):]
    if check:
        if stale:
            print(f"tune_docs: {doc}: blocks differ from the runs: {', '.join(stale)} "
                  f"(python3 tools/tune_docs.py rewrites them)")
            return 1
        return 0
    with open(doc, "w") as f:
        f.write(text)
    print(f"tune_docs: {doc}: {len(stale)} block(s) rewritten" + (f": {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
