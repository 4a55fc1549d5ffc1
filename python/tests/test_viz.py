"""Tests for tally.viz, the PyTorch snapshot export, on real reports.

The reports come from a small workload run in a child process through
ctypes against libtally.so (TALLY_LIB, else build/lib/libtally.so), with
TALLY_CONF=report_path:...,timeline:true: the library writes the report at
exit. The snapshot is then checked the way PyTorch's tools read it: the
field names and block states of torch.cuda.memory._snapshot(), the pickle
opcodes MemoryViz.js understands, and replays of device_traces as the web
viewer's timeline (alloc / free_completed) and segment views (walking back
from the final state) do them.
"""

import importlib.util
import json
import os
import pickle
import pickletools
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYDIR = os.path.join(ROOT, "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)

from tally import viz  # noqa: E402

MiB = 1 << 20

# Stage load: weights, a model-init copy kept, a scratch buffer; stage train:
# activations (large and small pool) freed with no tag pushed, one block on
# device 1; release_at_stage_end gives segment_free events. After the last
# stage a gradient bucket is freed while its stream is held, so it is still
# waiting (active_pending_free) when the report is written at exit.
WORKLOAD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.tally_malloc.restype = ctypes.c_void_p
lib.tally_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.tally_free.argtypes = [ctypes.c_void_p]
lib.tally_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.tally_host_stream_hold.argtypes = [ctypes.c_void_p, ctypes.c_int]
for f in ("tally_tag_push", "tally_stage_begin", "tally_stage_end"):
    getattr(lib, f).argtypes = [ctypes.c_char_p]
MiB = 1 << 20

def alloc(n, dev=0, stream=None):
    p = lib.tally_malloc(n, dev, stream)
    assert p, "tally_malloc failed"
    return p

lib.tally_stage_begin(b"load")
lib.tally_tag_push(b"weights")
w = [alloc(8 * MiB) for _ in range(3)]
lib.tally_tag_pop()
lib.tally_tag_push(b"model-init")
m = alloc(4 * MiB)
lib.tally_tag_pop()
lib.tally_tag_push(b"scratch")
lib.tally_free(alloc(24 * MiB))
lib.tally_tag_pop()
lib.tally_stage_end(b"load")

lib.tally_stage_begin(b"train")
for step in range(3):
    lib.tally_tag_push(b"activations")
    acts = [alloc((2 + i) * MiB + 4096 * step) for i in range(4)]
    small = [alloc(4096 * (i + 1)) for i in range(3)]
    lib.tally_tag_pop()
    for p in acts + small:
        lib.tally_free(p)
lib.tally_tag_push(b"stray")
stray = alloc(1 * MiB, 1)
lib.tally_tag_pop()
lib.tally_stage_end(b"train")

stream = ctypes.c_void_p(0x5000)
lib.tally_host_stream_hold(stream, 1)
lib.tally_tag_push(b"gradients")
g = alloc(6 * MiB)
lib.tally_tag_pop()
lib.tally_record_stream(g, stream)
lib.tally_free(g)
for p in w:
    lib.tally_free(p)
"""

# Opcodes the unpickler in PyTorch's MemoryViz.js handles.
VIEWER_OPCODES = {
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1",
    "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2", "APPEND",
    "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1",
    "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM",
}

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def find_lib():
    lib = os.environ.get("TALLY_LIB") or os.path.join(ROOT, "build", "lib", "libtally.so")
    return lib if os.path.exists(lib) else None


def run_workload(lib, report, extra_conf):
    conf = (f"backend:host,host_devices:2,home_device:0,leak_report:off,stage_report:false,"
            f"release_at_stage_end:true,report_path:{report}{extra_conf}")
    env = dict(os.environ, TALLY_CONF=conf)
    subprocess.run([sys.executable, "-c", WORKLOAD, lib], env=env, check=True, timeout=120)
    with open(report) as f:
        return json.load(f)


class VizTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        lib = find_lib()
        if not lib:
            raise unittest.SkipTest("libtally.so not built (make lib)")
        cls.tmp = tempfile.mkdtemp(prefix="tally-viz-")
        cls.path = os.path.join(cls.tmp, "report.json")
        cls.report = run_workload(lib, cls.path, ",timeline:true")
        cls.snap = viz.to_snapshot(viz.load_report(cls.path))
        cls.wrapped_path = os.path.join(cls.tmp, "wrapped.json")
        cls.wrapped = run_workload(lib, cls.wrapped_path, ",timeline:true,timeline_events:24")
        cls.plain_path = os.path.join(cls.tmp, "plain.json")
        cls.plain = run_workload(lib, cls.plain_path, "")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    # ---- layout ---------------------------------------------------------------

    def check_layout(self, snap):
        self.assertEqual(set(snap), {"segments", "device_traces", "allocator_settings", "tally"})
        last = None
        for seg in snap["segments"]:
            self.assertEqual(set(seg), SEGMENT_KEYS)
            self.assertIn(seg["segment_type"], ("small", "large"))
            key = (seg["device"], seg["address"])
            self.assertTrue(last is None or last < key, "segments sorted by device and address")
            last = key
            addr = seg["address"]
            allocated = active = requested = 0
            free_internal = free_external = in_use = 0
            for b in seg["blocks"]:
                # PyTorch's keys, plus tally's tag and stage on owned blocks.
                extra = {"tag", "stage"} if b["state"] != "inactive" else set()
                self.assertEqual(set(b), BLOCK_KEYS | extra)
                self.assertIn(b["state"], ("active_allocated", "active_pending_free", "inactive"))
                self.assertEqual(b["address"], addr, "blocks tile their segment")
                addr += b["size"]
                if b["state"] == "active_allocated":
                    allocated += b["size"]
                    in_use += b["requested_size"]
                    free_internal += b["size"] - b["requested_size"]
                    self.assertLessEqual(b["requested_size"], b["size"])
                else:
                    free_external += b["size"]
                if b["state"] != "inactive":
                    active += b["size"]
                    requested += b["requested_size"]
                    self.assertTrue(b["frames"], "an owned block names its owner")
            self.assertEqual(addr, seg["address"] + seg["total_size"])
            self.assertEqual(seg["allocated_size"], allocated)
            self.assertEqual(seg["active_size"], active)
            self.assertEqual(seg["requested_size"], requested)
            # _memory_viz.segsum's assertion
            self.assertEqual(free_internal + free_external + in_use, seg["total_size"])
        for trace in snap["device_traces"]:
            for e in trace:
                keys = set(e)
                if e["action"] == "oom":
                    keys = keys - {"device_free"} | {"addr"}
                self.assertEqual(keys, TRACE_KEYS)
                self.assertIn(e["action"], ("alloc", "free_requested", "free_completed", "segment_alloc",
                                            "segment_free", "oom"))

    def test_layout(self):
        self.check_layout(self.snap)
        self.assertEqual(len(self.snap["device_traces"]), 2)
        self.assertEqual(self.snap["tally"]["home_device"], 0)
        self.assertEqual(self.snap["allocator_settings"]["max_split_size"], -1)
        states = [b["state"] for s in self.snap["segments"] for b in s["blocks"]]
        self.assertIn("active_pending_free", states)
        self.assertIn("inactive", states)
        live = sorted(b["size"] for s in self.snap["segments"] if s["device"] == 0 for b in s["blocks"]
                      if b["state"] == "active_allocated")
        self.assertEqual(live, [4 * MiB])  # the model-init copy
        self.assertEqual([s["segment_type"] for s in self.snap["segments"] if s["device"] == 1], ["small"])
        # No segment is in a CUDA graph's pool: PyTorch's id for that is (0, 0).
        self.assertEqual({tuple(s["segment_pool_id"]) for s in self.snap["segments"]}, {(0, 0)})

    def test_device_traces_cover_a_device_known_only_by_its_segments(self):
        # A report whose devices list leaves out device 1 (a report cut by
        # hand), yet with segments there: device_traces still has one entry
        # per device up to the highest a segment is on, two, not more.
        report = viz.load_report(self.path)
        report["devices"] = [d for d in report["devices"] if int(d["device"]) == 0]
        self.assertIn(1, {int(s["device"]) for s in report["segments"]})
        snap = viz.to_snapshot(report)
        self.assertEqual(len(snap["device_traces"]), 2)
        self.assertEqual({s["device"] for s in snap["segments"]}, {0, 1})

    def test_pickle_readable_by_viewer(self):
        out = os.path.join(self.tmp, "snap.pickle")
        viz.write_snapshot(self.snap, out)
        with open(out, "rb") as f:
            data = f.read()
        ops = list(pickletools.genops(data))
        self.assertEqual(ops[0][0].name, "PROTO")
        self.assertTrue(2 <= ops[0][1] <= 4, "MemoryViz.js reads protocols 2-4")
        unknown = {op.name for op, _, _ in ops} - VIEWER_OPCODES
        self.assertEqual(unknown, set())
        self.assertEqual(pickle.loads(data), self.snap)

    def test_snapshot_temp_file_ignores_planted_links(self):
        out = os.path.join(self.tmp, "planted.pickle")
        victim = os.path.join(self.tmp, "victim")
        with open(victim, "w") as f:
            f.write("precious")
        planted = f"{out}.tmp{os.getpid()}"  # the name an older writer used
        os.symlink(victim, planted)
        viz.write_snapshot(self.snap, out)
        viz.write_snapshot(self.snap, out)
        with open(victim) as f:
            self.assertEqual(f.read(), "precious", "the snapshot was written through a planted link")
        self.assertTrue(os.path.islink(planted))
        with open(out, "rb") as f:
            self.assertEqual(pickle.load(f), self.snap)
        left = [n for n in os.listdir(self.tmp) if n.startswith("planted.pickle.tmp-")]
        self.assertEqual(left, [], "temporary files left behind")

    def test_snapshot_into_missing_directory_leaves_nothing(self):
        with self.assertRaises(FileNotFoundError):
            viz.write_snapshot(self.snap, os.path.join(self.tmp, "nodir", "x.pickle"))

    # ---- traces ---------------------------------------------------------------

    def replay_timeline(self, snap, device, complete):
        """As MemoryViz.js's process_alloc_data: what is allocated at the end."""
        live = {}
        for e in snap["device_traces"][device]:
            if e["action"] == "alloc":
                self.assertNotIn(e["addr"], live, "alloc of a live address")
                live[e["addr"]] = e["size"]
            elif e["action"] == "free_completed":
                if complete:
                    self.assertIn(e["addr"], live, "free of an address never allocated")
                live.pop(e["addr"], None)
        return live

    def test_trace_replay_matches_segments(self):
        for dev in (0, 1):
            live = self.replay_timeline(self.snap, dev, True)
            want = {b["address"]: b["size"] for s in self.snap["segments"] if s["device"] == dev
                    for b in s["blocks"] if b["state"] != "inactive"}
            self.assertEqual(live, want)
        # The waiting block's free was requested but has not completed.
        pending = [b for s in self.snap["segments"] for b in s["blocks"] if b["state"] == "active_pending_free"]
        self.assertEqual(len(pending), 1)
        acts = [e["action"] for e in self.snap["device_traces"][0] if e.get("addr") == pending[0]["address"]
                and not e["action"].startswith("segment")]
        self.assertEqual(acts[-2:], ["alloc", "free_requested"])

    def walk_back_segments(self, snap, device, complete):
        """As MemoryViz.js's segment view: from the final segments back to the
        first event, every block must lie in a segment at its time."""
        segs = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == device}

        def inside(addr):
            return any(a <= addr < a + n for a, n in segs.items())

        for e in reversed(snap["device_traces"][device]):
            if e["action"] == "segment_free":
                self.assertNotIn(e["addr"], segs)
                segs[e["addr"]] = e["size"]
            elif e["action"] == "segment_alloc":
                self.assertEqual(segs.pop(e["addr"], None), e["size"], "segment_alloc of a segment not held")
            elif e["action"] in ("alloc", "free_requested", "free_completed"):
                self.assertTrue(inside(e["addr"]), f"{e['action']} at {e['addr']:#x} outside every segment")
        if complete:
            self.assertEqual(segs, {}, "before the first event nothing was reserved")

    def test_segment_history(self):
        actions = {e["action"] for e in self.snap["device_traces"][0]}
        self.assertTrue({"segment_alloc", "segment_free", "alloc", "free_requested", "free_completed"} <= actions)
        for dev in (0, 1):
            self.walk_back_segments(self.snap, dev, True)

    def test_owner_frames(self):
        frames = {f["name"] for s in self.snap["segments"] for b in s["blocks"] for f in b["frames"]}
        self.assertIn("tag model-init, stage load", frames)
        self.assertIn("tag stray, stage train", frames)
        self.assertIn("tag gradients, stage (none)", frames)
        # Activations are freed with no tag pushed; their free entries still
        # name the tag they were allocated under.
        frees = [e for e in self.snap["device_traces"][0] if e["action"] == "free_requested"]
        names = {f["name"] for e in frees for f in e["frames"]}
        self.assertIn("tag activations, stage train", names)
        self.assertNotIn("tag untagged, stage train", names)
        for e in self.snap["device_traces"][0]:
            if e["action"] in ("alloc", "free_requested", "free_completed"):
                self.assertEqual(len(e["frames"]), 1)
                self.assertEqual(set(e["frames"][0]), {"filename", "line", "name"})
        # The owner frame, as docs/reports.md gives it: file "tally", line 0
        # (no source line), the owner as its name.
        owner = [f for s in self.snap["segments"] for b in s["blocks"] for f in b["frames"]
                 if f["name"] == "tag model-init, stage load"]
        self.assertTrue(owner)
        for f in owner:
            self.assertEqual(f, {"filename": "tally", "line": 0, "name": "tag model-init, stage load"})

    def test_stages(self):
        stages = [(s["action"], s["stage"]) for s in self.snap["tally"]["stages"] if s["device"] == 0]
        self.assertEqual(stages, [("stage_begin", "load"), ("stage_end", "load"), ("stage_begin", "train"),
                                  ("stage_end", "train")])

    def test_wrapped_timeline(self):
        # Only the newest 24 events per device were kept: frees of blocks
        # allocated earlier, and segments reserved earlier, must still fit.
        snap = viz.to_snapshot(viz.load_report(self.wrapped_path))
        self.check_layout(snap)
        self.assertLessEqual(len(snap["device_traces"][0]), 2 * 24)
        for dev in (0, 1):
            self.replay_timeline(snap, dev, False)
            self.walk_back_segments(snap, dev, False)

    def test_no_timeline(self):
        snap = viz.to_snapshot(viz.load_report(self.plain_path))
        self.check_layout(snap)
        self.assertEqual(snap["device_traces"], [[], []])
        self.assertEqual(len(snap["segments"]), len(self.plain["segments"]))

    # ---- command line -----------------------------------------------------------

    def run_cli(self, *args):
        env = dict(os.environ, PYTHONPATH=PYDIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
        return subprocess.run([sys.executable, "-m", "tally.viz", *args], env=env, capture_output=True, text=True,
                              timeout=120)

    def test_cli(self):
        out = os.path.join(self.tmp, "cli.pickle")
        r = self.run_cli(self.path, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"wrote {out}: ", r.stdout)
        with open(out, "rb") as f:
            self.assertEqual(pickle.load(f), self.snap)
        r = self.run_cli(self.plain_path, "-o", os.path.join(self.tmp, "plain.pickle"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("timeline:true", r.stderr)

    def test_cli_errors(self):
        r = self.run_cli(os.path.join(self.tmp, "missing.json"), "-o", os.path.join(self.tmp, "x.pickle"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("missing.json: cannot open: No such file or directory", r.stderr)
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w") as f:
            f.write('{"format": "tally-report", "devices": [}')
        r = self.run_cli(bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn("bad.json: malformed JSON: ", r.stderr)
        with open(bad, "w") as f:
            json.dump({"allocated_bytes.all.current": 0}, f)
        r = self.run_cli(bad)
        self.assertEqual(r.returncode, 1)
        self.assertIn("bad.json: not a tally report", r.stderr)
        r = self.run_cli("--bogus")
        self.assertEqual(r.returncode, 2)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "x.pickle")))
        # A readable report and an output that cannot be written: status 1,
        # one line naming the output and why, nothing printed as written.
        out = os.path.join(self.tmp, "nodir", "y.pickle")
        r = self.run_cli(self.path, "-o", out)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stderr, f"tally.viz: cannot write {out}: No such file or directory\n")
        self.assertEqual(r.stdout, "")

    @unittest.skipUnless(importlib.util.find_spec("torch"), "torch is not installed")
    def test_torch_tools_read_it(self):
        from torch.cuda import _memory_viz
        _memory_viz.segsum(self.snap)
        _memory_viz.trace(self.snap)
        html = _memory_viz.trace_plot(self.snap)
        self.assertIn("snapshot.pickle", html)


if __name__ == "__main__":
    unittest.main()
