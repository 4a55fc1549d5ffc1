"""``python -m tally``, run in subprocesses on the host backend, and the
package build: the commands, the exit status rules of ``run``, the reports
it prints, and the wheel the build backend makes."""

import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile
import hashlib
import base64

from . import support

LEAKY = textwrap.dedent(
    """\
    import sys
    import tally
    lib = tally.library()
    with tally.stage("load"), tally.tag("weights"):
        kept = lib.tally_malloc(3 << 20, 0, None)
    with tally.stage("train"):
        p = lib.tally_malloc(1000, 1, None)
        lib.tally_free(p)
    print("argv", sys.argv, __name__)
    """
)

CLEAN = textwrap.dedent(
    """\
    import tally
    lib = tally.library()
    with tally.stage("only"):
        p = lib.tally_malloc(4096, 0, None)
        lib.tally_free(p)
    print("clean done")
    """
)


class CliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def script(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def tally(self, *args, conf=None, **extra):
        return support.run_python(["-m", "tally", *args], conf=conf, cwd=self.dir, **extra)

    def test_help_lists_every_command(self):
        r = self.tally("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for command in ("run", "info", "options", "snapshot", "summary", "ledger", "merge", "plot", "tune",
                        "version"):
            self.assertIn(command, r.stdout)
        r = self.tally("run", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("leak_exitcode", r.stdout)
        r = self.tally()
        self.assertEqual(r.returncode, 2)

    def test_run_leaky_script_exits_with_leak_exitcode(self):
        path = self.script("leaky.py", LEAKY)
        r = self.tally("run", "--conf", "leak_exitcode:7", path, "one", "--two")
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertIn(f"argv ['{path}', 'one', '--two'] __main__", r.stdout)
        try:
            import torch  # noqa: F401
        except ImportError:
            self.assertIn("PyTorch is not installed", r.stderr)
        self.assertIn("PyTorch CUDA memory summary, device ID 0", r.stderr)
        self.assertIn("PyTorch CUDA memory summary, device ID 1", r.stderr)
        self.assertIn("3145728 bytes (3.0 MiB) in 1 block: tag weights, stage load, device 0", r.stderr)
        self.assertIn("SUMMARY: 3145728 bytes leaked in 1 block", r.stderr)
        # The library's own exit report does not repeat it.
        self.assertEqual(r.stderr.count("SUMMARY:"), 1)

    def test_run_without_leak_exitcode_keeps_the_scripts_status(self):
        path = self.script("leaky.py", LEAKY)
        r = self.tally("run", "--quiet", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("memory summary", r.stderr)
        self.assertIn("SUMMARY: 3145728 bytes leaked", r.stderr)

    def test_run_clean_script(self):
        path = self.script("clean.py", CLEAN)
        r = self.tally("run", "--ledger", "--conf", "leak_exitcode:7", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("clean done", r.stdout)
        self.assertIn("no leaks", r.stderr)
        self.assertIn("tally ledger", r.stderr)

    def test_run_puts_the_scripts_folder_first_on_the_path(self):
        # As `python job/main.py` does: the script's folder is sys.path[0],
        # so its helper module wins over one of the same name in the current
        # folder (which `python -m tally` puts on the path too).
        os.mkdir(os.path.join(self.dir, "job"))
        self.script("helper.py", "WHO = 'current folder'\n")
        self.script(os.path.join("job", "helper.py"), "WHO = 'script folder'\n")
        path = self.script(os.path.join("job", "main.py"), textwrap.dedent(
            """\
            import os, sys
            import helper
            print("helper from", helper.WHO)
            print("first", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
            """))
        r = self.tally("run", "--quiet", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("helper from script folder\n", r.stdout)
        self.assertIn("first True\n", r.stdout)

    def test_run_exit_status_and_errors(self):
        r = self.tally("run", self.script("exit3.py", "import sys\nsys.exit(3)\n"))
        self.assertEqual(r.returncode, 3, r.stderr)
        # sys.exit with a message: the message on stderr and status 1, as python gives.
        r = self.tally("run", self.script("exitmsg.py", "import sys\nsys.exit('stopped: no data')\n"))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("stopped: no data\n", r.stderr)
        r = self.tally("run", self.script("boom.py", "raise ValueError('boom')\n"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("ValueError: boom", r.stderr)
        r = self.tally("run", "--conf", "no_such_key:1", self.script("ok.py", "pass\n"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no_such_key", r.stderr)
        r = self.tally("run")
        self.assertEqual(r.returncode, 2)

    def test_run_module_and_report(self):
        os.mkdir(os.path.join(self.dir, "pkg"))
        self.script("pkg/__init__.py", "")
        self.script("pkg/job.py", LEAKY)
        report = os.path.join(self.dir, "rank%r.json")
        r = self.tally("run", "--report", report, "-m", "pkg.job", "x", RANK="3")
        self.assertEqual(r.returncode, 0, r.stderr)
        # As with python -m: argv[0] is the module's file.
        self.assertIn(f"argv ['{os.path.join(self.dir, 'pkg', 'job.py')}', 'x'] __main__", r.stdout)
        written = os.path.join(self.dir, "rank3.json")
        self.assertTrue(os.path.exists(written), r.stderr)

        r = self.tally("snapshot", written, "-o", os.path.join(self.dir, "snap.pickle"))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.dir, "snap.pickle"), "rb") as f:
            snap = pickle.load(f)
        tags = {b.get("tag") for s in snap["segments"] for b in s["blocks"]}
        self.assertIn("weights", tags)
        r = self.tally("snapshot", os.path.join(self.dir, "missing.json"))
        self.assertEqual(r.returncode, 1)

    def test_stage_report_at_stage_end(self):
        path = self.script("leaky.py", LEAKY)
        r = self.tally("run", "--quiet", path, conf="backend:host,host_devices:2,stage_report:true")
        self.assertIn("stage load ended", r.stderr)
        self.assertIn("still live under tag weights", r.stderr)

    def test_info_and_options(self):
        r = self.tally("info")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("backend: host", r.stdout)
        self.assertIn("devices: 2", r.stdout)
        r = self.tally("options", "--explain")
        self.assertIn("host_devices:2    # ", r.stdout)

    def test_options_output_is_a_tally_conf(self):
        """What `options` prints, given back as TALLY_CONF, prints the same:
        the configured values (home_device:auto), in TALLY_CONF's syntax."""
        conf = "backend:host,host_devices:2,host_capacity:3GiB,persistent_tags:weights|optimizer,leak_report:full"
        r = self.tally("options", conf=conf)
        self.assertEqual(r.returncode, 0, r.stderr)
        printed = r.stdout.strip()
        self.assertEqual(len(r.stdout.splitlines()), 1, r.stdout)
        self.assertIn("home_device:auto", printed)
        self.assertIn("host_capacity:3GiB", printed)
        again = self.tally("options", conf=printed)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(again.stdout.strip(), printed)

    def assertOneLineError(self, r, line, status):
        """The command failed with status, and its whole stderr is line."""
        self.assertEqual(r.returncode, status, r.stderr)
        self.assertEqual(r.stderr, line + "\n")

    def test_command_errors_are_one_line(self):
        ok = self.script("ok.py", "print('ran')\n")
        bad_json = self.script("bad.json", '{"a":\n')
        other = self.script("other.json", '{"format": "x"}')
        cases = [
            (["run", "nope.py"], None, "tally: run: cannot open nope.py: No such file or directory", 2),
            (["run", "-m", "nosuchmod"], None, "tally: run: no module named nosuchmod", 1),
            (["run", "-m", "nosuchpkg.job"], None, "tally: run: no module named nosuchpkg", 1),
            (["run", "--conf", "leak_report:ful", ok], None,
             "tally: config: leak_report: unknown value 'ful' (valid: off, summary, full)", 2),
            (["run", ok], "backend:host,leak_reprot:full",
             "tally: TALLY_CONF: config: unknown key 'leak_reprot' (did you mean 'leak_report'?)", 2),
            (["info"], "backend:host,home_device:5",
             "tally: config: home_device: 5 is not a device (1 device: 0)", 2),
            (["options"], "leak_report:ful",
             "tally: TALLY_CONF: config: leak_report: unknown value 'ful' (valid: off, summary, full)", 2),
            (["snapshot", "missing.json"], None, "tally: snapshot: missing.json: cannot open: No such file or directory", 1),
            (["snapshot", bad_json], None,
             f"tally: snapshot: {bad_json}: malformed JSON: Expecting value: line 2 column 1 (char 6)", 1),
            (["snapshot", other], None,
             f"tally: snapshot: {other}: not a tally report (write one with TALLY_CONF=report_path:FILE)", 1),
        ]
        for args, conf, line, status in cases:
            with self.subTest(args=args, conf=conf):
                self.assertOneLineError(self.tally(*args, conf=conf), line, status)
        r = self.tally("info", TALLY_LIB="/nonexistent/libtally.so")
        self.assertOneLineError(
            r, "tally: TALLY_LIB=/nonexistent/libtally.so: no such file (unset TALLY_LIB to use the installed library)", 2)
        r = self.tally("info", TALLY_LIB=bad_json)
        self.assertEqual(r.returncode, 2)
        self.assertTrue(r.stderr.startswith(f"tally: TALLY_LIB={bad_json}: cannot be loaded: "), r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        # TALLY_DEBUG=1 shows where.
        r = self.tally("info", TALLY_LIB="/nonexistent/libtally.so", TALLY_DEBUG="1")
        self.assertIn("Traceback", r.stderr)

    def test_unwritable_report_fails_the_run(self):
        """docs/pytorch.md: a report that cannot be written is a non-zero
        exit status, not a line lost in the output of a run that passed."""
        ok = self.script("ok.py", "print('ran')\n")
        # A folder that is not there: refused before the program runs.
        r = self.tally("run", "--report", "/nonexistent/r.json", ok)
        self.assertOneLineError(r, "tally: run: --report /nonexistent/r.json: cannot write there: no folder /nonexistent", 2)
        # A folder named with %r is known only when the report is written: the
        # program runs, and the status says the report was lost.
        r = self.tally("run", "--report", "/nonexistent%r/r.json", ok, RANK="1")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ran", r.stdout)
        self.assertIn("tally: run: tally_write_report: cannot open '/nonexistent1/r.json' for writing", r.stderr)
        self.assertEqual(r.stderr.count("cannot open"), 1, r.stderr)  # the library's exit does not repeat it
        # The program's own failure status wins over the lost report's.
        bad = self.script("bad.py", "raise SystemExit(7)\n")
        self.assertEqual(self.tally("run", "--report", "/nonexistent%r/r.json", bad, RANK="1").returncode, 7)
        # A writable one is written once, and the run passes.
        report = os.path.join(self.dir, "r.json")
        r = self.tally("run", "--report", report, ok)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(report) as f:
            self.assertIn('"format"', f.read())

    def test_env_vars_that_look_like_configuration(self):
        """LEAK_REPORT=full (a key as its own variable) or a misspelt TALLY_CONF
        (3 to 7 letters after TALLY_) is never read: one line each names the TALLY_CONF item meant; generic
        names (BACKEND, TRACE) other programs use are left alone."""
        r = self.tally("options", LEAK_REPORT="full", TALLY_CONFIG="leak_report:full", TALLY_BACKTRACE_DEPTH="4",
                       BACKEND="x", TRACE="1", TALLY_TRACES="/x", TALLY_CNF="x", TALLY_CO="x",
                       MAX_SPLIT_SIZE_MB="64", TALLY_C0NF="x", TALLY_CONF9="x", leak_report="full",
                       TALLY_conf2="x")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(r.stderr.splitlines()), [
            "tally: LEAK_REPORT in the environment is not read (did you mean TALLY_CONF=leak_report:full?)",
            "tally: MAX_SPLIT_SIZE_MB in the environment is not read (did you mean TALLY_CONF=max_split_size_mb:64?)",
            "tally: TALLY_BACKTRACE_DEPTH in the environment is not read (did you mean TALLY_CONF=backtrace_depth:4?)",
            "tally: TALLY_C0NF is not read (did you mean TALLY_CONF?)",  # capitals, digits and _ count
            "tally: TALLY_CNF is not read (did you mean TALLY_CONF?)",  # three letters: the shortest named
            "tally: TALLY_CONF9 is not read (did you mean TALLY_CONF?)",
            "tally: TALLY_CONFIG is not read (did you mean TALLY_CONF?)",
        ])  # TALLY_CO, two letters, is too short to be taken for it; lower case (leak_report, TALLY_conf2) is
        # some other program's
        self.assertIn("leak_report:summary", r.stdout)  # nothing changed
        r = self.tally("options")
        self.assertEqual(r.stderr, "")
        # A name longer than any key (here 300 characters) is passed over,
        # whatever it holds.
        r = self.tally("options", **{"TALLY_" + "LEAK_REPORT_" * 25: "full", "LEAK_" * 60 + "REPORT": "full"})
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_runner_frames_are_hidden(self):
        """Under `python -m tally run`, the runner's own frames (tally/_cli.py,
        tally/__main__.py, runpy) are neither recorded in allocation sites
        (python_stack) nor shown in the program's traceback."""
        script = self.script("deep.py", textwrap.dedent("""\
            import tally
            lib = tally.library()
            kept = []
            def inner():
                kept.append(lib.tally_malloc(4096, 0, None))
            def outer():
                inner()
            outer()
            def boom():
                raise ValueError("bad")
            boom()
            """))
        report = os.path.join(self.dir, "deep.json")
        r = self.tally("run", "--conf", "python_stack:8", "--report", report, script)
        self.assertEqual(r.returncode, 1, r.stderr)
        tb = r.stderr[r.stderr.index("Traceback"):r.stderr.index("ValueError: bad")]
        self.assertEqual([line.split(",")[0].strip() for line in tb.splitlines() if line.strip().startswith("File")],
                         [f'File "{script}"'] * 2, tb)
        with open(report) as f:
            doc = __import__("json").load(f)
        frames = [(fr["filename"], fr["name"]) for site in doc["sites"] for fr in site["frames"]]
        self.assertEqual(frames, [(script, "inner"), (script, "outer"), (script, "<module>")])

    def test_damaged_report_is_named(self):
        """docs/bad-input.md: a garbled, missing or inconsistent field of a
        report is named in one line, never read as 0; a newer version is
        refused, an older one and a consistent hand edit are read."""
        report = os.path.join(self.dir, "r.json")
        w = support.run_python(["-c", "import tally; lib = tally.library(); p = lib.tally_malloc(4096, 0, None); "
                                f"tally.write_report({report!r})"])
        self.assertEqual(w.returncode, 0, w.stderr)
        with open(report) as f:
            text = f.read()
        doc = __import__("json").loads(text)
        current = doc["devices"][0]["stats"]["segment.all.allocated"]
        cases = [
            ('"active.all.allocated"', '"active.all.alocated"',
             'devices[0].stats: unknown key "active.all.alocated" (did you mean "active.all.allocated"?)'),
            # two edits away is still a likely typing slip; three is not named
            ('"active.all.allocated"', '"active.all.alocatd"',
             'devices[0].stats: unknown key "active.all.alocatd" (did you mean "active.all.allocated"?)'),
            ('"active.all.allocated"', '"active.all.alcatd"', 'devices[0].stats: unknown key "active.all.alcatd"'),
            # a swap is of two neighbours: the key, its first and last letters, then the key again but its first
            # is 19 edits away, not 1 (a swap across the ends, b[-1] in Python, would make it 1)
            ('"active.all.peak"', '"active.all.peakakctive.all.peak"',
             'devices[0].stats: unknown key "active.all.peakakctive.all.peak"'),
            ('"num_ooms": 0, ', "", 'devices[0].stats: key "num_ooms" is missing'),
            (f'"segment.all.allocated": {current},', f'"segment.all.allocated": {current + 1},',
             f'devices[0].stats: "segment.all.allocated" is {current + 1}, but small_pool + large_pool is {current}'),
            ('"version":"0.1.0"', '"version":"9.0.0"',
             "written by tally 9.0.0, newer than this tally (0.1.0): read it with tally 9.0 or later"),
        ]
        for old, new, want in cases:
            with self.subTest(want=want):
                self.assertIn(old, text)
                bad = self.script("bad.json", text.replace(old, new, 1))
                r = self.tally("snapshot", bad, "-o", os.path.join(self.dir, "x.pickle"))
                self.assertOneLineError(r, f"tally: snapshot: {bad}: not a valid tally report: {want}", 1)
        cut = self.script("cut.json", text[:700])
        r = self.tally("snapshot", cut)
        self.assertEqual(r.returncode, 1)
        self.assertIn("malformed JSON", r.stderr)
        self.assertIn("(char ", r.stderr)
        for old, new in (('"version":"0.1.0"', '"version":"0.0.1"'), ('"backend":"host"', '"backend":"by-hand"')):
            ok = self.script("ok.json", text.replace(old, new, 1))
            r = self.tally("snapshot", ok, "-o", os.path.join(self.dir, "ok.pickle"))
            self.assertEqual(r.returncode, 0, r.stderr)

    def test_snapshot_to_a_bad_path_and_without_a_timeline(self):
        report = os.path.join(self.dir, "r.json")
        w = support.run_python(["-c", f"import tally; tally.write_report({report!r})"])
        self.assertEqual(w.returncode, 0, w.stderr)
        r = self.tally("snapshot", report, "-o", "/nonexistent/x.pickle")
        self.assertOneLineError(r, "tally: snapshot: cannot write /nonexistent/x.pickle: No such file or directory", 1)
        r = self.tally("snapshot", report)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("trace_plot", r.stdout)  # nothing to show over time
        self.assertIn("no trace events: the report has no timeline", r.stdout)
        self.assertIn("segment_plot", r.stdout)

    def test_library_not_found_is_clear(self):
        code = "import tally._lib as l; l._candidates = lambda: []; l.library()"
        r = support.run_python(["-c", code])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot find libtally.so", r.stderr)


class TorchCheckScriptTest(unittest.TestCase):
    """bench/gpu/torch_check.sh needs a GPU; here its Python parts are
    byte-compiled and its verdict is run on made-up results."""

    def test_compiles_and_judges(self):
        import json

        script = support.REPO / "bench" / "gpu" / "torch_check.sh"
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run(["bash", str(script), "--compile-only"], env=dict(os.environ, TALLY_CHECK_DIR=tmp,
                               PYTHON=sys.executable), capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            run = {"steps_per_s": 10.0, "peak_reserved": 1 << 30, "peak_allocated": 1 << 29, "final_loss": 9.0,
                   "error": None}
            files = {
                "native.json": dict(run, mode="native", checks={}),
                "tally.json": dict(run, mode="tally", checks={"oom_raises": True, "backend_is_cuda": True}),
                "report.json": {"leaks": [{"tag": "deliberate-leak", "stage": "(none)", "device": 0,
                                           "bytes": 8 << 20}]},
            }
            for name, doc in files.items():
                with open(os.path.join(tmp, name), "w") as f:
                    json.dump(doc, f)
            with open(os.path.join(tmp, "tally.stderr"), "w") as f:
                f.write("tally: 8388608 bytes (8.0 MiB) in 1 block: tag deliberate-leak, stage (none), device 0\n")
            verdict = [sys.executable, os.path.join(tmp, "verdict.py"), tmp]
            r = subprocess.run(verdict, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("all checks passed", r.stdout)
            files["tally.json"]["checks"]["oom_raises"] = False
            with open(os.path.join(tmp, "tally.json"), "w") as f:
                json.dump(files["tally.json"], f)
            r = subprocess.run(verdict, capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("FAIL oom_raises", r.stdout)


class InstallWithoutTorchTest(unittest.TestCase):
    def test_install_says_torch_is_absent(self):
        code = textwrap.dedent(
            """\
            import sys
            sys.modules["torch"] = None  # as if PyTorch were not installed
            import tally
            for fn in (tally.install, tally.patch_torch):
                try:
                    fn()
                except tally.TallyError as e:
                    print("error:", e)
            """
        )
        r = support.run_python(["-c", code])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("PyTorch is not installed"), 2, r.stdout)


class BuildTest(unittest.TestCase):
    """The package's build backend makes a wheel holding libtally.so."""

    @staticmethod
    def build_wheel(directory):
        """tally_build.build_wheel(directory): the wheel's file name."""
        sys.path.insert(0, str(support.PYTHON_DIR))
        try:
            import tally_build
        finally:
            sys.path.pop(0)
        return tally_build.build_wheel(directory)

    def test_wheel_contents(self):
        with tempfile.TemporaryDirectory() as tmp:
            name = self.build_wheel(tmp)
            with zipfile.ZipFile(os.path.join(tmp, name)) as whl:
                names = set(whl.namelist())
                self.assertIn("tally/libtally.so", names)
                self.assertIn("tally/__main__.py", names)
                self.assertIn("tally-0.1.0.dist-info/METADATA", names)
                record = whl.read("tally-0.1.0.dist-info/RECORD").decode().splitlines()
                for line in record:
                    path, digest, size = line.rsplit(",", 2)
                    if not digest:
                        continue
                    data = whl.read(path)
                    self.assertEqual(int(size), len(data))
                    expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    self.assertEqual(digest, f"sha256={expect}")
            self.assertTrue(name.startswith("tally-0.1.0-py3-none-"))

    def test_wheel_is_reproducible(self):
        """Two builds of the same tree give the same bytes: every entry is a
        regular file dated 2020-01-01 00:00 (a valid DOS date, not the build
        time), so a wheel's hash says what it holds."""
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            name_a, name_b = self.build_wheel(a), self.build_wheel(b)
            self.assertEqual(name_a, name_b)
            with open(os.path.join(a, name_a), "rb") as fa, open(os.path.join(b, name_b), "rb") as fb:
                self.assertEqual(fa.read(), fb.read())
            with zipfile.ZipFile(os.path.join(a, name_a)) as whl:
                for info in whl.infolist():
                    self.assertEqual(info.date_time, (2020, 1, 1, 0, 0, 0), info.filename)
                    self.assertEqual(info.external_attr >> 28, 0o10, info.filename)  # S_IFREG

    def test_wheel_ships_the_command_line_tool(self):
        """Unpacked as pip would, with no TALLY_CLI, TALLY_LIB or build tree
        on PATH, `python -m tally merge` runs the tool inside the package."""
        with tempfile.TemporaryDirectory() as tmp:
            name = self.build_wheel(tmp)
            site = os.path.join(tmp, "site")
            with zipfile.ZipFile(os.path.join(tmp, name)) as whl:
                info = whl.getinfo("tally/bin/tally")
                self.assertTrue((info.external_attr >> 16) & 0o111, "tally/bin/tally is not executable")
                whl.extractall(site)
            for member in ("tally/bin/tally", "tally/libtally.so"):
                os.chmod(os.path.join(site, member), 0o755)  # what pip does for executable members
            env = {k: v for k, v in os.environ.items() if k not in ("TALLY_CLI", "TALLY_LIB")}
            env.update(PYTHONPATH=site, PATH="/usr/bin:/bin")
            report = os.path.join(tmp, "rank0.json")
            w = support.run_python(["-c", f"import tally; tally.write_report({report!r})"])
            self.assertEqual(w.returncode, 0, w.stderr)
            r = subprocess.run([sys.executable, "-m", "tally", "merge", report], env=env, cwd=tmp,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("tally merge: 1 report", r.stdout)

    def test_every_tool_command_through_the_package(self):
        """`python -m tally` is the whole tool for a pip-only user: unpacked
        as pip would, run outside the repository with no TALLY_CLI, TALLY_LIB
        or build tree, every `tally` subcommand gives the same stdout, stderr
        and exit status as the tool itself, help and errors included."""
        with tempfile.TemporaryDirectory() as tmp:
            name = self.build_wheel(tmp)
            site = os.path.join(tmp, "site")
            with zipfile.ZipFile(os.path.join(tmp, name)) as whl:
                whl.extractall(site)
            tool = os.path.join(site, "tally", "bin", "tally")
            for member in ("tally/bin/tally", "tally/libtally.so"):
                os.chmod(os.path.join(site, member), 0o755)
            env = {k: v for k, v in os.environ.items() if k not in ("TALLY_CLI", "TALLY_LIB", "PYTHONPATH")}
            env.update(PATH="/usr/bin:/bin", TALLY_CONF="backend:host,timeline:true,trace:true")
            report = os.path.join(tmp, "r.json")
            code = ("import tally; lib = tally.library()\n"
                    "with tally.stage('load'), tally.tag('weights'):\n"
                    "    kept = [lib.tally_malloc(1 << 20, 0, None) for _ in range(3)]\n"
                    f"tally.write_report({report!r})\n")
            w = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=site), cwd=tmp,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(w.returncode, 0, w.stderr)
            trace = os.path.join(str(support.REPO), "tests", "fixtures", "tune", "small.pickle")
            cases = [
                ["summary", report], ["summary", "--device", "0", "-a", report], ["summary", "--help"],
                ["summary"], ["summary", "missing.json"], ["ledger", report], ["ledger", "--help"],
                ["merge", report], ["merge", "--json", report], ["merge"],
                ["plot", report, "-o", os.path.join(tmp, "p.svg")], ["plot", report], ["plot", "--help"],
                ["tune", "--help"], ["tune", report], ["version"], ["--version"],
            ]
            if os.path.exists(trace):
                cases.append(["tune", trace])
            for args in cases:
                with self.subTest(args=args):
                    want = subprocess.run([tool, *args], env=env, cwd=tmp, capture_output=True, text=True, timeout=120)
                    got = subprocess.run([sys.executable, "-m", "tally", *args], env=dict(env, PYTHONPATH=site),
                                         cwd=tmp, capture_output=True, text=True, timeout=120)
                    # Timings (tune's "0.01 s") are the one thing that may differ.
                    seconds = __import__("re").compile(r"[0-9]+\.[0-9]+ s\b")
                    self.assertEqual((got.returncode, got.stdout, seconds.sub("T s", got.stderr)),
                                     (want.returncode, want.stdout, seconds.sub("T s", want.stderr)))
            # The answers are real ones, not two identical failures.
            r = subprocess.run([sys.executable, "-m", "tally", "ledger", report], env=dict(env, PYTHONPATH=site),
                               cwd=tmp, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("weights", r.stdout)
            # A misspelt command: one line with the nearest, exit 2, as the tool.
            r = subprocess.run([sys.executable, "-m", "tally", "sumary", report], env=dict(env, PYTHONPATH=site),
                               cwd=tmp, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn("tally: unknown command 'sumary' (did you mean 'summary'?", r.stderr)

    @unittest.skipUnless(os.environ.get("TALLY_TEST_PIP"), "set TALLY_TEST_PIP=1 to pip-install into a venv")
    def test_pip_install_into_a_venv(self):
        with tempfile.TemporaryDirectory() as tmp:
            venv = os.path.join(tmp, "v")
            subprocess.check_call([sys.executable, "-m", "venv", "--system-site-packages", venv])
            pip = os.path.join(venv, "bin", "pip")
            subprocess.check_call([pip, "install", "--no-index", "--no-build-isolation", str(support.PYTHON_DIR)])
            env = dict(os.environ, TALLY_CONF="backend:host")
            env.pop("TALLY_LIB", None)
            env.pop("PYTHONPATH", None)
            out = subprocess.check_output(
                [os.path.join(venv, "bin", "python"), "-c", "import tally; print(tally.library_path())"],
                env=env, cwd=tmp, text=True)
            self.assertTrue(out.strip().startswith(venv), out)
            # The tally command came with it: merge runs without TALLY_CLI or a build tree on PATH.
            report = os.path.join(tmp, "r0.json")
            python = os.path.join(venv, "bin", "python")
            subprocess.check_call([python, "-c", f"import tally; tally.write_report({report!r})"], env=env, cwd=tmp)
            env.pop("TALLY_CLI", None)
            env["PATH"] = "/usr/bin:/bin"
            out = subprocess.check_output([python, "-m", "tally", "merge", report], env=env, cwd=tmp, text=True)
            self.assertIn("tally merge: 1 report", out)


class DistanceTest(unittest.TestCase):
    """The edit distance behind the checker's "did you mean": one per
    insertion, deletion, substitution or swap of neighbours, as the C
    side's (test_core_config_errors); none between equal strings."""

    def test_one_per_edit(self):
        from tally._check import _distance
        cases = [("abc", "abc", 0), ("", "", 0), ("", "abc", 3), ("abc", "", 3), ("abc", "ab", 1),
                 ("ab", "abc", 1), ("abc", "bc", 1), ("bc", "abc", 1), ("abc", "abd", 1), ("abc", "acb", 1),
                 ("abcd", "badc", 2), ("kitten", "sitting", 3), ("allocated", "alocatd", 2)]
        for a, b, want in cases:
            self.assertEqual(_distance(a, b), want, f"{a!r} -> {b!r}")

    def test_matches_a_recursive_definition(self):
        # The restricted edit distance (no substring edited twice), defined
        # recursively on the strings' ends, on every pair of strings of up
        # to four letters over a three-letter alphabet.
        import functools
        import itertools
        from tally._check import _distance

        @functools.lru_cache(maxsize=None)
        def ref(a, b):
            if not a or not b:
                return len(a) + len(b)
            best = min(ref(a[:-1], b) + 1, ref(a, b[:-1]) + 1, ref(a[:-1], b[:-1]) + (a[-1] != b[-1]))
            if len(a) > 1 and len(b) > 1 and a[-1] == b[-2] and a[-2] == b[-1]:
                best = min(best, ref(a[:-2], b[:-2]) + 1)
            return best

        words = ["".join(w) for n in range(5) for w in itertools.product("abc", repeat=n)]
        for a in words:
            for b in words:
                self.assertEqual(_distance(a, b), ref(a, b), f"{a!r} -> {b!r}")


if __name__ == "__main__":
    unittest.main()
