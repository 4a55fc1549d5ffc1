"""The figures the docs quote, regenerated from the program and compared.

Each figure is a region of a doc between `<!-- figure: NAME -->` and
`<!-- /figure -->` (invisible in rendered Markdown) whose text this script
can make again from the program's own output; a few are single values found
with a pattern. `make test` runs the check (tests/check_docs.sh): a doc that
no longer matches the program fails, naming the figure and the first line
that differs.

    python3 tests/docs_figures.py --check            every figure: ok NAME / FAIL NAME: why / SKIP NAME: why
    python3 tests/docs_figures.py --update           rewrite the regions from the program's output
    python3 tests/docs_figures.py --make-test-seconds N
                                                     N (the time .ci/run measured for make test) lies in
                                                     the range docs/testing.md gives

Environment: BUILD (default build), TALLY_TRACES (default ../shared/traces).
Standard library only."""

import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
TALLY = os.path.join(BUILD, "bin", "tally")
TRACES = os.environ.get("TALLY_TRACES") or os.path.join(os.path.dirname(ROOT), "shared", "traces")
MIB = 1 << 20


class Skip(Exception):
    pass


def run(args, env=None, check=True):
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.strip()[:300]}")
    return r


# tally tune asks an installed torch for its version unless told: the figures must not depend on one.
NO_TORCH = dict(os.environ, TALLY_PYTHON="false")


def need_traces():
    if not os.path.isdir(TRACES):
        raise Skip(f"no shared traces at {TRACES} (set TALLY_TRACES)")


def rel(path):
    return os.path.relpath(path, ROOT)


# ---- the figures ---------------------------------------------------------------


def tune_snapshot_example():
    """docs/tune.md: tally tune on the gpt2 snapshot, its stderr line and table."""
    need_traces()
    path = os.path.join(TRACES, "snapshots", "gpt2-small-compiled-train.pickle")
    r = run([TALLY, "tune", "--torch-version", "2.11", path], env=NO_TORCH)
    shown = "../shared/traces/snapshots/gpt2-small-compiled-train.pickle"
    line = re.sub(r", [0-9]+ workers?, [0-9.]+ s$", "", r.stderr.strip().splitlines()[-1])
    out = r.stdout.replace(path, shown).rstrip("\n")
    return (f"`build/bin/tally tune --torch-version 2.11 {shown}`; on stderr: `{line}` (then the workers and "
            f"seconds).\n\n```\n{out}\n```")


def tune_report_example():
    """docs/tune.md: the demo's report with trace:true, tuned at 24 GiB: the
    first rows, the end, and the sentence that quotes its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "demo.json")
        env = dict(os.environ, TALLY_CONF=f"backend:host,trace:true,report_path:{report}")
        run([os.path.join(BUILD, "bin", "demo")], env=env)
        r = run([TALLY, "tune", "-q", "--torch-version", "2.11", "--capacity", "24GiB", report], env=NO_TORCH)
        j = json.loads(run([TALLY, "tune", "-q", "--json", "--capacity", "24GiB", report], env=NO_TORCH).stdout)
    lines = r.stdout.replace(report, "demo.json").rstrip("\n").splitlines()
    end = max(i for i, l in enumerate(lines) if l.startswith("PyTorch's allocator:"))
    shown = lines[:8] + ["..."] + lines[end - 1:]
    default = j[0]
    exp = next(row for row in j if row["setting"] == "expandable_segments:True" and row["allocator"] == "tally")
    budget = int(re.search(r"call budget ([0-9]+)", r.stdout).group(1))
    saved = (default["peak_reserved_bytes"] - exp["peak_reserved_bytes"]) / MIB
    verdict = ("over the budget of %d, so the default stays" % budget if exp["backend_calls"] > budget
               else "within the budget of %d" % budget)
    oom = [r for r in j if not r["fits"]]
    fracs = sorted({float(m.group(1)) for r in oom for m in [re.search(r"memory_fraction:([0-9.]+)", r["setting"])]
                    if m})
    tail = ""
    if oom and len(fracs) == 1:
        tail = (f" The {len(oom)} rows with the tightest fraction ({fracs[0] * 100:.1f}% of 24 GiB = "
                f"{fracs[0] * 24576:.0f} MiB) run out of memory: they do not fit, and the peak shown is where "
                "they stopped.")
    return ("`TALLY_CONF=trace:true,report_path:demo.json build/bin/demo`, then `tally tune -q --capacity 24GiB "
            "demo.json`\n(the first rows and the end):\n\n```\n" + "\n".join(shown) + "\n```\n\n"
            f"tally's expandable segments reserve {saved:.0f} MiB less and make {exp['backend_calls']} backend calls "
            f"against the default's {default['backend_calls']}: {verdict}.{tail}")


def shared_files():
    need_traces()
    files = sorted(f for f in os.listdir(TRACES) if f.endswith(".csv"))
    snaps = os.path.join(TRACES, "snapshots")
    if os.path.isdir(snaps):
        files += ["snapshots/" + f for f in sorted(os.listdir(snaps)) if f.endswith(".pickle")]
    return files


_rows_cache = {}


def tune_rows(name):
    if name not in _rows_cache:
        _rows_cache[name] = json.loads(run([TALLY, "tune", "-q", "--json", os.path.join(TRACES, name)],
                                           env=NO_TORCH).stdout)
    return _rows_cache[name]


SNAPSHOTS = ["gpt2-small-compiled-train", "opt125m-zeroth-order-finetune", "transformer-d768-l12-train",
             "transformer-forward-ctx128", "transformer-medium-ctx1024-train", "transformer-train-4steps-cold",
             "transformer-xl-forward-ctx512-expandable"]


def tune_accuracy_table():
    """docs/tune.md: the replay of the recorded setting from the recorded
    state against PyTorch's recorded peak, on the seven shared snapshots."""
    need_traces()
    with open(os.path.join(TRACES, "reference.json")) as f:
        ref = {r["trace"]: r for r in json.load(f)}
    mib = lambda b: "%.1f" % (b / MIB)
    out = ["`build/bin/tally tune -q --json` on each shared snapshot; PyTorch = `pytorch_native_peak_reserved_bytes` "
           "of reference.json; MiB unless marked:", "",
           "| snapshot | recorded setting | PyTorch | replay from the recorded state | difference | replay from empty "
           "(same setting) | PyTorch's recommendation | MiB | tally's recommendation | MiB |",
           "|---|---|---:|---:|---:|---:|---|---:|---|---:|"]
    for name in SNAPSHOTS:
        rows = tune_rows(f"snapshots/{name}.pickle")
        pt = ref[name + ".csv"]["pytorch_native_peak_reserved_bytes"]
        replay = rows[0]["recorded_replay_peak_reserved_bytes"]
        rec_pt = next(r for r in rows if r["recommended"])
        rec_t = next(r for r in rows if r["recommended_tally"])
        conf = next((r for r in rows if r["why"] == "the setting the job ran with"), None)
        if conf is None:  # the grid holds the recorded setting: its row under PyTorch's rules
            want = "expandable_segments:True" if "expandable" in name else ""
            conf = next(r for r in rows if r["setting"] == want and r["allocator"] != "tally")
        out.append(f"| {name} | `{conf['setting'] or '(default)'}` | {mib(pt)} | {mib(replay)} | {replay - pt:+d} B "
                   f"({100.0 * (replay - pt) / pt:+.3f}%) | {mib(conf['peak_reserved_bytes'])} | "
                   f"`{rec_pt['setting'] or '(default)'}` ({rec_pt['allocator']}) | {mib(rec_pt['peak_reserved_bytes'])} | "
                   f"`{rec_t['setting'] or '(default)'}` | {mib(rec_t['peak_reserved_bytes'])} |")
    return "\n".join(out)


THREE = "op,id,size,stream\na,1,31457280,0\na,2,1000,0\na,3,5242880,0\n"


def tune_budgets():
    """docs/tune.md: the refusals (--capacity, --max-calls, --max-driver-time)
    and a row's least memory, on a hand trace of three blocks."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "three.csv")
        with open(path, "w") as f:
            f.write(THREE)
        out = ["```", "$ cat three.csv", THREE.rstrip()]
        for args in (["--capacity", "30MiB"], ["--capacity", "1GiB", "--max-calls", "0"],
                     ["--capacity", "1GiB", "--max-driver-time", "0.3ms"]):
            r = run([TALLY, "tune", "-q", *args, path], env=NO_TORCH, check=False)
            out += [f"$ tally tune -q {' '.join(args)} three.csv >/dev/null; echo $?",
                    r.stderr.rstrip().replace(path, "three.csv"), str(r.returncode)]
        row = json.loads(run([TALLY, "tune", "-q", "--json", "--capacity", "1GiB", path], env=NO_TORCH).stdout)[0]
        out.append("$ tally tune -q --json --capacity 1GiB three.csv   # the default's row, in part")
        keys = ("setting", "allocator", "peak_reserved_bytes", "min_device_bytes", "driver_us_a100",
                "driver_us_blackwell", "runs_out")
        out.append(json.dumps({k: row[k] for k in keys}))
        out.append("```")
        return "\n".join(out)


def tune_grid_size():
    """docs/tune.md: how many settings the grid has on the shared traces."""
    counts = [len(tune_rows(name)) for name in shared_files()]
    lo, hi = min(counts), max(counts)
    return (f"That is {lo} to {hi} settings per trace" if lo != hi else f"That is {lo} settings per trace") + \
        " (on the shared traces)."


def tune_bench_trace():
    """docs/tune.md's make bench table: the events and settings of the
    synthetic trace (gen_trace --model 7b --steps 9); deterministic, unlike
    its seconds, which are a measurement of that run."""
    with tempfile.TemporaryDirectory() as tmp:
        gen, trace = os.path.join(tmp, "gen_trace"), os.path.join(tmp, "t.csv")
        run([os.environ.get("CC", "cc"), "-O2", "-o", gen, os.path.join(ROOT, "bench", "gen_trace.c"), "-lm"])
        run([gen, "--model", "7b", "--steps", "9", "--out", trace])
        with open(trace) as f:
            events = sum(1 for _ in f) - 1
        settings = len(json.loads(run([TALLY, "tune", "-q", "--json", trace], env=NO_TORCH).stdout))
    return events, settings


def tune_bench_values(text):
    """(what the doc says, what the program gives) for the make bench table."""
    m = re.search(r"^\| tune-7b-9steps\.csv \| ([0-9]+) \| ([0-9]+) \|", text, re.M)
    w = re.search(r"synthetic trace of ([0-9,]+) events", text)
    have = (m.group(1), m.group(2), w.group(1) if w else None) if m else None
    events, settings = tune_bench_trace()
    return have, (str(events), str(settings), f"{events:,}")


GOAL_ROWS = [("tally", "expandable_segments:True", "tally's default"),
             ("PyTorch (model)", "expandable_segments:True", "PyTorch's expandable segments"),
             ("tally", "expandable_segments:True,expandable_move_budget:10000", "budget 10 ms"),
             ("tally", "expandable_segments:True,expandable_move_budget:-1", "budget -1")]


def issue21_goals():
    """docs/benchmarks.md: issue 21's memory and driver-time goals (3 and 4)
    on the nine shared CSV traces, from tally tune's rows: peak reserved over
    peak live for tally's default expandable segments, PyTorch's (tune's
    model of them), and the move budget at 10 ms and unlimited; the whole
    trace's modelled driver time of the default against PyTorch's."""
    need_traces()
    names = sorted(f for f in os.listdir(TRACES) if f.endswith(".csv"))
    out = ["`build/bin/tally tune -q --json TRACE` on each shared CSV trace (`tests/docs_figures.py` remakes this table "
           "and `make test` compares it): peak reserved MiB (/ peak live), and the whole trace's modelled driver "
           "time (A100 / Blackwell ms, the stand-in's cost table):", "",
           "| trace | peak live | " + " | ".join(r[2] for r in GOAL_ROWS) +
           " | driver ms, default | driver ms, PyTorch's |",
           "|---|---:|" + "---:|" * len(GOAL_ROWS) + "---:|---:|"]
    sums = [0.0] * len(GOAL_ROWS)
    excess = {}
    for name in names:
        rows = {(r["allocator"], r["setting"]): r for r in tune_rows(name)}
        live = rows[(GOAL_ROWS[0][0], GOAL_ROWS[0][1])]["peak_live_bytes"]
        cells = []
        for i, (alloc, setting, _) in enumerate(GOAL_ROWS):
            r = rows[(alloc, setting)]
            ratio = r["peak_reserved_bytes"] / live
            sums[i] += ratio
            cells.append(f"{r['peak_reserved_bytes'] / MIB:,.0f} ({ratio:.4f})")
        d, p = rows[(GOAL_ROWS[0][0], GOAL_ROWS[0][1])], rows[(GOAL_ROWS[1][0], GOAL_ROWS[1][1])]
        excess[name] = d["peak_reserved_bytes"] / live - 1
        ms = lambda r: f"{r['driver_us_a100'] / 1000:.2f} / {r['driver_us_blackwell'] / 1000:.2f}"
        out.append(f"| {name[:-4]} | {live / MIB:,.0f} | " + " | ".join(cells) + f" | {ms(d)} | {ms(p)} |")
    n = len(names)
    out.append(f"| mean over the {n} | | " + " | ".join(f"{s / n:.4f}" for s in sums) + " | | |")
    worst = max(excess, key=excess.get)
    out += ["", f"A mean of 1.01 over the {n} traces leaves {0.01 * n:.2f} of excess (peak reserved / peak live - 1) "
            f"to share among them; tally's default has {sums[0] - n:.4f}, and {worst[:-4]} alone {excess[worst]:.4f}."]
    return "\n".join(out)


RMM_MODEL = os.path.join(BUILD, "bench", "rmm-pool-model")
LEAST_ROWS = [("tally", "expandable_segments:True"), ("tally", "expandable_segments:True,expandable_move_budget:-1"),
              ("PyTorch (model)", "expandable_segments:True")]


def rmm_pool_table():
    """docs/benchmarks.md: the model of RAPIDS RMM's pool (bench's
    rmm-pool-model: grown from nothing, and its least pool) beside tally
    tune's rows on the nine shared CSV traces: peak reserved untuned, and
    the least device each needs (min_device_bytes). In bold the least of a
    row's four least-memory cells, where one is least alone."""
    need_traces()
    if not os.access(RMM_MODEL, os.X_OK):
        raise RuntimeError(f"{rel(RMM_MODEL)} is not built (make test builds it)")
    rmm = {}
    for line in run([RMM_MODEL, TRACES]).stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 12 and cells[0].endswith(".csv"):
            rmm[cells[0]] = (float(cells[2]), float(cells[3]), float(cells[5]), float(cells[6]))
    names = sorted(f for f in os.listdir(TRACES) if f.endswith(".csv"))
    out = ["`build/bench/rmm-pool-model` and `build/bin/tally tune -q --json TRACE` on each shared CSV trace "
           "(`tests/docs_figures.py` remakes this table and `make test` compares it): MiB (/ peak live); in bold the "
           "least of a row's four least-memory cells where one is least alone:", "",
           "| trace | peak live | RMM grown | tally, no setting (PyTorch's rules) | tally, expandable segments "
           "| RMM least pool | tally expandable, least device | tally, `expandable_move_budget:-1`, least device "
           "| PyTorch expandable (model), least device |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        rows = {(r["allocator"], r["setting"]): r for r in tune_rows(name)}
        default, expand = rows[("PyTorch/tally", "")], rows[("tally", "expandable_segments:True")]
        live = default["peak_live_bytes"]
        grown, grown_ratio, least, least_ratio = rmm[name]
        cell = lambda b: f"{b / MIB:,.0f} ({b / live:.3f})"
        leasts = [(least, f"{least:,.0f} ({least_ratio:.3f})")]
        leasts += [(rows[k]["min_device_bytes"] / MIB, cell(rows[k]["min_device_bytes"])) for k in LEAST_ROWS]
        low = min(v for v, _ in leasts)
        alone = sum(1 for v, _ in leasts if v == low) == 1
        shown = [f"**{t}**" if alone and v == low else t for v, t in leasts]
        out.append(f"| {name[:-4]} | {live / MIB:,.0f} | {grown:,.0f} ({grown_ratio:.3f}) | {cell(default['peak_reserved_bytes'])} "
                   f"| {cell(expand['peak_reserved_bytes'])} | " + " | ".join(shown) + " |")
    return "\n".join(out)


# Figures quoted as single values inside prose or a table of measurements:
# NAME -> (doc, function(text) -> (what the doc says, what the program gives)).
VALUES = {
    "tune-bench-trace-events-settings": ("docs/tune.md", tune_bench_values),
}

FIGURES = {
    "tune-snapshot-example": ("docs/tune.md", tune_snapshot_example),
    "tune-report-example": ("docs/tune.md", tune_report_example),
    "tune-accuracy": ("docs/tune.md", tune_accuracy_table),
    "tune-budgets": ("docs/tune.md", tune_budgets),
    "tune-grid-size": ("docs/tune.md", tune_grid_size),
    "issue21-goals": ("docs/benchmarks.md", issue21_goals),
    "rmm-pool": ("docs/benchmarks.md", rmm_pool_table),
}

REGION = re.compile(r"(<!-- figure: ([a-z0-9-]+) -->\n)(.*?)(\n<!-- /figure -->)", re.S)


def regions(doc):
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def first_difference(want, have):
    a, b = want.splitlines(), have.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else "(nothing)"
        y = b[i] if i < len(b) else "(nothing)"
        if x != y:
            return f"line {i + 1}: the doc has {y[:160]!r}, the program gives {x[:160]!r}"
    return "same"


def check(update=False):
    failed = 0
    texts = {}
    for name, (doc, make) in FIGURES.items():
        text = texts.setdefault(doc, regions(doc))
        found = [m for m in REGION.finditer(text) if m.group(2) == name]
        if len(found) != 1:
            print(f"FAIL {name}: {doc} has {len(found)} regions '<!-- figure: {name} -->' (want 1)")
            failed = 1
            continue
        try:
            want = make()
        except Skip as e:
            print(f"SKIP {name}: {e}")
            continue
        except Exception as e:  # the program failed: that is a failure of the figure
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            failed = 1
            continue
        have = found[0].group(3)
        if have == want:
            print(f"ok {name} ({doc})")
        elif update:
            m = found[0]
            texts[doc] = text[:m.start(3)] + want + text[m.end(3):]
            print(f"updated {name} ({doc})")
        else:
            print(f"FAIL {name}: {doc} differs from the program: {first_difference(want, have)} "
                  f"(python3 tests/docs_figures.py --update rewrites it)")
            failed = 1
    for name, (doc, compare) in VALUES.items():
        text = texts.setdefault(doc, regions(doc))
        try:
            have, want = compare(text)
        except Skip as e:
            print(f"SKIP {name}: {e}")
            continue
        except Exception as e:
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            failed = 1
            continue
        if have == want:
            print(f"ok {name} ({doc}: {', '.join(want)})")
        else:
            print(f"FAIL {name}: {doc} says {have}, the program gives {want} (edit the doc by hand)")
            failed = 1
    if update:
        for doc, text in texts.items():
            with open(os.path.join(ROOT, doc), "w") as f:
                f.write(text)
    return failed


def check_make_test_seconds(seconds):
    """docs/testing.md gives make test's time as "N to M minutes" (or
    seconds) on the reference machine; the measured time must lie in it."""
    text = regions("docs/testing.md")
    m = re.search(r"^\| `make test` \|[^|]*\| ([0-9.]+) to ([0-9.]+) (minutes|seconds)", text, re.M)
    if not m:
        print("FAIL make-test-time: docs/testing.md gives no '`make test` | ... | N to M minutes' row")
        return 1
    scale = 60 if m.group(3) == "minutes" else 1
    lo, hi = float(m.group(1)) * scale, float(m.group(2)) * scale
    if lo <= seconds <= hi:
        print(f"ok make-test-time: {seconds:.0f} s is within docs/testing.md's {m.group(1)} to {m.group(2)} "
              f"{m.group(3)}")
        return 0
    print(f"FAIL make-test-time: make test took {seconds:.0f} s; docs/testing.md says {m.group(1)} to "
          f"{m.group(2)} {m.group(3)}")
    return 1


def main(argv):
    if argv[:1] == ["--make-test-seconds"] and len(argv) == 2:
        return check_make_test_seconds(float(argv[1]))
    if argv in (["--check"], []):
        return check()
    if argv == ["--update"]:
        return check(update=True)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
