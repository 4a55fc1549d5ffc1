"""Python frames per allocation (python_stack): a script that allocates
through ctypes.CDLL from named functions and never frees names its own
lines in the leak report and the JSON report; a foreign-device block names
the line that put it there; suppressions and tally.ignore; a capture leaves
the frames' reference counts as they were."""

import json
import os
import re
import tempfile
import unittest
from pathlib import Path

from tally import _lib, viz

from .support import run_python

SCRIPT = Path(__file__).resolve().parent / "scripts" / "leaky_model.py"
BASE = "backend:host,host_devices:2,host_capacity:1GiB,home_device:0,leak_report:full"


def line_of(marker):
    """The line of the script marked "# line:MARKER"."""
    for n, text in enumerate(SCRIPT.read_text().splitlines(), 1):
        if text.rstrip().endswith("# line:" + marker):
            return n
    raise AssertionError("no line marked " + marker)


def frame(func, marker):
    return "in %s %s:%d (python)" % (func, SCRIPT, line_of(marker))


class PythonFramesTest(unittest.TestCase):
    def run_script(self, mode, conf):
        return run_python([str(SCRIPT), mode], conf=conf, TALLY_LIB=_lib.library_path())

    def test_leak_report_and_json_name_make_model(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "r.json")
            r = self.run_script("once", BASE + ",python_stack:8,report_path:" + report)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("Direct leak of 4194304 bytes (4.0 MiB) in 1 block allocated from:", r.stderr)
            self.assertRegex(r.stderr, r"#0 " + re.escape(frame("make_model", "make_model")) + "\n")
            self.assertRegex(r.stderr, r"#1 " + re.escape(frame("main", "main_once")) + "\n")
            doc = json.loads(Path(report).read_text())
            (leak,) = doc["leaks"]
            self.assertEqual(leak["site"], "make_model %s:%d" % (SCRIPT, line_of("make_model")))
            sites = {s["id"]: s for s in doc["sites"]}
            frames = sites[leak["site_id"]]["frames"]
            self.assertEqual(frames[0], {"name": "make_model", "filename": str(SCRIPT),
                                         "line": line_of("make_model"), "python": True})
            self.assertEqual(frames[1]["line"], line_of("main_once"))

    def test_snapshot_export_has_the_frames(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "r.json")
            r = self.run_script("once", BASE + ",python_stack:8,timeline:true,report_path:" + report)
            self.assertEqual(r.returncode, 0, r.stderr)
            snap = viz.to_snapshot(viz.load_report(report))
        want = {"filename": str(SCRIPT), "line": line_of("make_model"), "name": "make_model"}
        blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        self.assertEqual(len(blocks), 1)
        self.assertEqual(blocks[0]["frames"][0], want)
        self.assertEqual(blocks[0]["frames"][1]["line"], line_of("main_once"))
        self.assertEqual(blocks[0]["frames"][-1]["name"], "tag untagged, stage (none)")
        (alloc,) = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        self.assertEqual(alloc["frames"][0], want)

    def test_model_built_twice_names_the_second_line_and_the_foreign_block(self):
        r = self.run_script("twice", BASE + ",python_stack:8,leak_exitcode:3")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(frame("main", "main_second"), r.stderr)
        self.assertNotIn(frame("main", "main_first"), r.stderr)  # freed
        # The checkpoint landed on device 1 while this process's device is 0.
        self.assertIn(frame("load_checkpoint", "load_checkpoint"), r.stderr)
        self.assertIn(frame("main", "main_checkpoint"), r.stderr)
        self.assertIn("device 1 (foreign: home device is 0)", r.stderr)

    def test_blocks_from_one_line_are_one_site(self):
        """Three blocks allocated from the same Python line share one site:
        the leak report names it once, for all three."""
        r = self.run_script("same_line", BASE + ",python_stack:8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("allocated from:"), 1, r.stderr)
        self.assertIn("Direct leak of 3145728 bytes (3.0 MiB) in 3 blocks allocated from:", r.stderr)
        self.assertIn(frame("main", "main_same_line"), r.stderr)

    def test_suppression_silences_one_and_not_the_other(self):
        with tempfile.TemporaryDirectory() as tmp:
            supp = os.path.join(tmp, "s.supp")
            Path(supp).write_text("# checkpoints are kept on purpose\nleak:load_checkpoint\n")
            r = self.run_script("twice", BASE + ",python_stack:8,leak_exitcode:3,leak_suppressions:" + supp)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn(frame("main", "main_second"), r.stderr)
            self.assertNotIn(frame("load_checkpoint", "load_checkpoint"), r.stderr)
            self.assertIn("suppressed by leak:load_checkpoint", r.stderr)
            self.assertIn("SUMMARY: 4194304 bytes leaked in 1 block (1 block suppressed)", r.stderr)

    def test_ignored_block_never_sets_the_exit_code(self):
        r = self.run_script("ignored", BASE + ",python_stack:8,leak_exitcode:3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ignored (tally_ignore): 4194304 bytes", r.stderr)

    def test_without_python_stack_no_python_frames(self):
        r = self.run_script("once", BASE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("(python)", r.stderr)
        self.assertIn("SUMMARY: 4194304 bytes leaked in 1 block", r.stderr)


if __name__ == "__main__":
    unittest.main()


REFCOUNT_SCRIPT = """
import ctypes, os, sys
lib = ctypes.CDLL(os.environ["TALLY_LIB"])
lib.tally_malloc.restype = ctypes.c_void_p
lib.tally_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.tally_free.argtypes = [ctypes.c_void_p]

def inner():
    me = sys._getframe()
    caller = me.f_back
    before = (sys.getrefcount(me), sys.getrefcount(caller))
    for _ in range(50):
        lib.tally_free(lib.tally_malloc(4096, 0, None))
    after = (sys.getrefcount(me), sys.getrefcount(caller))
    print("before", before, "after", after)

def outer():
    inner()

outer()
"""


class FrameReferencesTest(unittest.TestCase):
    def test_capturing_a_stack_leaves_frame_references_as_they_were(self):
        """python_stack walks the frames with a borrowed reference to the
        innermost and new ones to the callers (PyFrame_GetBack): fifty
        captures from inner() leave the reference counts of its frame and of
        its caller's as they were. Releasing the borrowed one would free a
        running frame; keeping the new ones would leak every caller."""
        r = run_python(["-c", REFCOUNT_SCRIPT], conf=BASE + ",python_stack:8", TALLY_LIB=_lib.library_path())
        self.assertEqual(r.returncode, 0, r.stderr)
        m = re.fullmatch(r"before \((-?\d+), (-?\d+)\) after \((-?\d+), (-?\d+)\)\n", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        self.assertEqual((m.group(1), m.group(2)), (m.group(3), m.group(4)), r.stdout)


LEAKS_SCRIPT = """
import tally
lib = tally.library()

def allocate_here():
    return lib.tally_malloc(4096, 0, None)  # line:allocate_here

p = allocate_here()
(group,) = tally.leaks()
print(group["frames"][0]["name"], group["frames"][0]["line"], group["frames"][0]["python"])
lib.tally_free(p)
"""


class LeaksApiTest(unittest.TestCase):
    def test_leaks_carry_their_frames(self):
        r = run_python(["-c", LEAKS_SCRIPT], conf=BASE + ",python_stack:4")
        self.assertEqual(r.returncode, 0, r.stderr)
        line = next(n for n, t in enumerate(LEAKS_SCRIPT.splitlines(), 1) if t.endswith("# line:allocate_here"))
        self.assertEqual(r.stdout, "allocate_here %d True\n" % line)


IGNORE_SCRIPT = """
import tally
lib = tally.library()
a = lib.tally_malloc(4096, 0, None)
b = lib.tally_malloc(8192, 0, None)
class Tensor:
    def data_ptr(self):
        return b
tally.ignore(a)
tally.ignore(Tensor())
try:
    tally.ignore(a + 512)
except tally.TallyError as e:
    print("refused:", e)
"""


class IgnoreTest(unittest.TestCase):
    def test_ignore_takes_addresses_and_tensors_and_refuses_others(self):
        r = run_python(["-c", IGNORE_SCRIPT], conf=BASE + ",leak_exitcode:3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ignored (tally_ignore): 12288 bytes (12.0 KiB) in 2 blocks", r.stderr)
        self.assertIn("refused: tally_ignore: ", r.stdout)
        self.assertIn("not the start of a live block", r.stdout)


TORCH_SCRIPT = """
import ctypes, os
lib = ctypes.CDLL(os.environ["TALLY_LIB"])
lib.tally_torch_alloc.restype = ctypes.c_void_p
lib.tally_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
assert lib.tally_torch_alloc(4096, 0, None)
"""


class NativeFramesTest(unittest.TestCase):
    def test_frames_inside_libtally_are_left_out(self):
        # PyTorch's entry point calls tally_malloc inside libtally.so: the
        # first native frame kept is its caller's (here ctypes' libffi).
        r = run_python(["-c", TORCH_SCRIPT], conf=BASE + ",backtrace_depth:4", TALLY_LIB=_lib.library_path())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("#0 0x", r.stderr)
        self.assertNotIn("tally_torch_alloc", r.stderr)
        self.assertNotIn("libtally.so", r.stderr)
