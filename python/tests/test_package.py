"""The tally package in this process, on the host backend: stages, tags,
the torch.cuda-named statistics, reports, options, snapshots. Memory is
allocated through the C API (ctypes), as a program without PyTorch would."""

import ctypes
import json
import os
import pickle
import tempfile
import threading
import unittest

import tally
from tally import _lib

from . import CONF  # noqa: F401  (sets TALLY_CONF before tally starts)

lib = tally.library()


def malloc(size, device=0, stream=None):
    p = lib.tally_malloc(size, device, stream)
    assert p, tally._lib.last_error()
    return p


def free(p):
    lib.tally_free(ctypes.c_void_p(p))


def live_rows(tag=None, stage=None):
    rows = [r for r in tally.ledger() if r["current_bytes"] > 0]
    if tag is not None:
        rows = [r for r in rows if r["tag"] == tag]
    if stage is not None:
        rows = [r for r in rows if r["stage"] == stage]
    return rows


class LibraryTest(unittest.TestCase):
    def test_loaded_on_host_backend(self):
        self.assertEqual(tally.backend(), "host")
        self.assertEqual(tally.device_count(), 2)
        self.assertEqual(tally.version(), tally.__version__)
        self.assertTrue(os.path.isabs(tally.library_path()))
        if os.environ.get("TALLY_LIB"):
            self.assertEqual(os.path.realpath(tally.library_path()), os.path.realpath(os.environ["TALLY_LIB"]))

    def test_check_passes(self):
        tally.check()

    def test_error_carries_code_and_message(self):
        with self.assertRaises(tally.TallyError) as cm:
            tally.memory_stats(7)
        self.assertEqual(cm.exception.code_name, "EINVAL")
        self.assertIn("device 7 does not exist", str(cm.exception))


class StageTagTest(unittest.TestCase):
    def test_stage_and_tag_own_allocations(self):
        with tally.stage("py-load"), tally.tag("py-weights"):
            p = malloc(3 << 20)
        rows = live_rows("py-weights", "py-load")
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0]["current_bytes"], 3 << 20)
        free(p)
        self.assertEqual(live_rows("py-weights"), [])

    def test_decorators(self):
        @tally.stage("py-deco-stage")
        @tally.tag("py-deco-tag")
        def work():
            return malloc(4096, device=1)

        p = work()
        rows = live_rows("py-deco-tag", "py-deco-stage")
        self.assertEqual([r["device"] for r in rows], [1])
        free(p)
        work_again = work()  # a decorator can be entered again
        free(work_again)

    def test_auto_named_tag_is_the_call_site(self):
        with tally.tag() as t:
            p = malloc(1024)
        self.assertRegex(t.name, r"^test_package\.py:\d+$")
        self.assertEqual(len(live_rows(t.name)), 1)
        free(p)

        @tally.tag()
        def helper():
            return malloc(1024)

        p = helper()
        name = f"{helper.__module__}.StageTagTest.test_auto_named_tag_is_the_call_site.<locals>.helper"
        self.assertEqual(len(live_rows(name)), 1)
        free(p)

    def test_tags_are_per_thread(self):
        seen = {}

        def other():
            seen["p"] = malloc(2048)

        with tally.tag("py-main-thread"):
            t = threading.Thread(target=other)
            t.start()
            t.join()
        self.assertEqual(live_rows("py-main-thread"), [])
        free(seen["p"])

    def test_stage_end_mismatch_is_an_error(self):
        outer = tally.stage("py-outer")
        outer.__enter__()
        with self.assertRaises(tally.TallyError) as cm:
            tally.stage("py-inner-never-begun").__exit__(None, None, None)
        self.assertIn("py-outer", str(cm.exception))
        outer.__exit__(None, None, None)

    def test_exception_inside_is_not_masked(self):
        with self.assertRaises(KeyError):
            with tally.stage("py-raises"), tally.tag("py-raises-tag"):
                raise KeyError("inner")
        # Both were closed: a new stage can begin and end at top level.
        with tally.stage("py-after"):
            pass

    def test_bad_names(self):
        with self.assertRaises(TypeError):
            tally.tag(42)
        with self.assertRaises(tally.TallyError):
            with tally.tag(""):
                pass


class StatsTest(unittest.TestCase):
    def setUp(self):
        tally.empty_cache()

    def test_memory_stats_keys_are_torchs(self):
        stats = tally.memory_stats(0)
        expected = set()
        for stat in _lib.POOL_STATS:
            for pool in _lib.POOLS:
                for field in _lib.FIELDS:
                    expected.add(f"{stat}.{pool}.{field}")
        for stat in ("oversize_allocations", "oversize_segments"):
            for field in _lib.FIELDS:
                expected.add(f"{stat}.{field}")
        expected |= {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
                     "num_device_alloc", "num_device_free"}
        self.assertEqual(set(stats), expected)
        self.assertEqual(list(stats), sorted(stats))
        self.assertEqual(stats["max_split_size"], -1)

    def test_nested_dict_is_memory_stats_unflattened(self):
        flat = tally.memory_stats(1)
        nested = tally.memory_stats_as_nested_dict(1)
        self.assertEqual(nested["allocated_bytes"]["all"]["current"], flat["allocated_bytes.all.current"])
        self.assertEqual(nested["num_ooms"], flat["num_ooms"])
        back = {}

        def walk(prefix, node):
            for key, value in node.items():
                if isinstance(value, dict):
                    walk(f"{prefix}{key}.", value)
                else:
                    back[prefix + key] = value

        walk("", nested)
        self.assertEqual(back, dict(flat))

    def test_mem_get_info_and_memory_fraction(self):
        free, total = tally.mem_get_info(1)
        self.assertEqual(total, 1 << 30)  # host_capacity:1GiB
        self.assertTrue(0 < free <= total)
        self.assertEqual(tally.mem_get_info("cuda:1"), (free, total))
        self.assertEqual(tally.get_per_process_memory_fraction(1), 1.0)
        tally.set_per_process_memory_fraction(0.25, 1)
        try:
            self.assertEqual(tally.get_per_process_memory_fraction(1), 0.25)
            self.assertEqual(tally.get_per_process_memory_fraction(0), 1.0)
            self.assertFalse(lib.tally_malloc(512 << 20, 1, None))  # over a quarter of 1 GiB
            self.assertIn("memory fraction limit", tally._lib.last_error())
        finally:
            tally.set_per_process_memory_fraction(1.0, 1)
        self.assertEqual(tally.get_per_process_memory_fraction(1), 1.0)
        with self.assertRaises(ValueError):
            tally.set_per_process_memory_fraction(1.5, 1)
        with self.assertRaises(TypeError):
            tally.set_per_process_memory_fraction(1, 1)  # torch wants a float too

    def test_values_move_and_getters_agree(self):
        before = tally.memory_stats(1)
        p = malloc(5 << 20, device=1)
        after = tally.memory_stats(1)
        self.assertEqual(after["allocation.all.current"], before["allocation.all.current"] + 1)
        self.assertEqual(after["requested_bytes.all.current"], before["requested_bytes.all.current"] + (5 << 20))
        self.assertEqual(tally.memory_allocated(1), after["allocated_bytes.all.current"])
        self.assertEqual(tally.max_memory_allocated(1), after["allocated_bytes.all.peak"])
        self.assertEqual(tally.memory_reserved(1), after["reserved_bytes.all.current"])
        self.assertEqual(tally.max_memory_reserved(1), after["reserved_bytes.all.peak"])
        self.assertEqual(tally.memory_allocated("cuda:1"), tally.memory_allocated(1))
        free(p)
        self.assertEqual(tally.memory_allocated(1), before["allocated_bytes.all.current"])

    def test_struct_offsets_match_the_json(self):
        p = malloc(100000)
        q = malloc(30 << 20)
        free(p)
        stats = tally.memory_stats(0)
        for stat in _lib.POOL_STATS:
            for pool in _lib.POOLS:
                for field in _lib.FIELDS:
                    self.assertEqual(_lib.pool_stat(0, stat, field, pool), stats[f"{stat}.{pool}.{field}"],
                                     f"{stat}.{pool}.{field}")
        free(q)

    def test_reset_peak_and_accumulated(self):
        p = malloc(8 << 20)
        free(p)
        self.assertGreaterEqual(tally.max_memory_allocated(0), 8 << 20)
        tally.reset_peak_memory_stats(0)
        self.assertEqual(tally.max_memory_allocated(0), tally.memory_allocated(0))
        tally.reset_accumulated_memory_stats(0)
        stats = tally.memory_stats(0)
        self.assertEqual(stats["allocation.all.allocated"], 0)
        self.assertEqual(stats["allocation.all.freed"], 0)
        self.assertEqual(stats["num_device_alloc"], 0)

    def test_empty_cache_releases(self):
        p = malloc(3 << 20)
        free(p)
        self.assertGreater(tally.memory_reserved(0), 0)
        self.assertIsNone(tally.empty_cache())
        self.assertEqual(tally.memory_reserved(0), 0)

    def test_memory_summary_text(self):
        p = malloc(12345, device=1)
        text = tally.memory_summary(1)
        lines = text.splitlines()
        self.assertTrue(text.endswith("\n"))
        self.assertTrue(lines[0].startswith("|====="))
        self.assertIn("PyTorch CUDA memory summary, device ID 1", lines[1])
        self.assertTrue(all(len(line) == 77 for line in lines), [len(x) for x in lines])
        self.assertIn("from large pool", text)
        self.assertIn("12345 B", text)  # requested memory, current
        short = tally.memory_summary(device=1, abbreviated=True)
        self.assertNotIn("from large pool", short)
        self.assertLess(len(short), len(text))
        free(p)

    def test_device_argument_forms(self):
        class FakeDevice:
            type = "cuda"
            index = 1

        self.assertEqual(tally.device_index(None), 0)
        self.assertEqual(tally.device_index(1), 1)
        self.assertEqual(tally.device_index("cuda:1"), 1)
        self.assertEqual(tally.device_index("cuda"), 0)
        self.assertEqual(tally.device_index(FakeDevice()), 1)
        with self.assertRaises(ValueError):
            tally.device_index("cpu")
        with self.assertRaises(TypeError):
            tally.device_index(1.5)


class ReportTest(unittest.TestCase):
    def test_ledger_and_leaks(self):
        with tally.stage("py-report"), tally.tag("py-kept"):
            p = malloc(1 << 20, device=1)
        leaks = [g for g in tally.leaks() if g["tag"] == "py-kept"]
        self.assertEqual(len(leaks), 1)
        self.assertEqual(leaks[0]["stage"], "py-report")
        self.assertEqual(leaks[0]["device"], 1)
        self.assertEqual(leaks[0]["bytes"], 1 << 20)
        self.assertIn("py-kept", tally.ledger_text())
        self.assertIn("tag py-kept, stage py-report, device 1", tally.leaks_text())
        self.assertIn("SUMMARY", tally.leaks_text(full=False))
        # Mid-run: what is live now, not what was left at exit.
        self.assertIn("still live now", tally.leaks_text())
        self.assertNotIn("at exit", tally.leaks_text())
        self.assertIn("still live at exit", tally.leaks_text(at_exit=True))
        free(p)
        self.assertEqual([g for g in tally.leaks() if g["tag"] == "py-kept"], [])

    def test_write_report(self):
        with tempfile.TemporaryDirectory() as tmp:
            tally.write_report(os.path.join(tmp, "r-%p.json"))
            path = os.path.join(tmp, f"r-{os.getpid()}.json")
            doc = tally.load_report(path)
            self.assertEqual(doc["format"], "tally-report")
            self.assertEqual(doc["pid"], os.getpid())
            self.assertEqual(len(doc["devices"]), 2)
            with open(os.path.join(tmp, "bad.json"), "w") as f:
                json.dump({"format": "other"}, f)
            with self.assertRaises(ValueError):
                tally.load_report(os.path.join(tmp, "bad.json"))
        with self.assertRaises(tally.TallyError):
            tally.write_report("/nonexistent-dir/x.json")

    def test_memory_snapshot(self):
        with tally.tag("py-snap"):
            p = malloc(70000, device=0)
        segments = tally.memory_snapshot()
        blocks = [b for s in segments for b in s["blocks"] if b["address"] == p]
        self.assertEqual(len(blocks), 1)
        self.assertEqual(blocks[0]["state"], "active_allocated")
        self.assertEqual(blocks[0]["requested_size"], 70000)
        self.assertEqual(blocks[0]["tag"], "py-snap")
        self.assertIn("tag py-snap", blocks[0]["frames"][0]["name"])
        for seg in segments:
            self.assertEqual(seg["total_size"], sum(b["size"] for b in seg["blocks"]))
            self.assertEqual(seg["allocated_size"],
                             sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"))
            self.assertIn(seg["segment_type"], ("small", "large"))
        free(p)

    def test_snapshot_pickle_for_the_visualiser(self):
        p = malloc(4096, device=1)
        free(p)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.pickle")
            tally.dump_snapshot(path)
            with open(path, "rb") as f:
                snap = pickle.load(f)
        self.assertLessEqual({"segments", "device_traces"}, set(snap))
        self.assertEqual(len(snap["device_traces"]), 2)
        actions = {e["action"] for e in snap["device_traces"][1]}
        self.assertTrue({"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions, actions)
        addrs = [e["addr"] for e in snap["device_traces"][1] if e["action"] == "alloc"]
        self.assertIn(p, addrs)


class OptionsTest(unittest.TestCase):
    def test_options_reflect_the_environment(self):
        opts = tally.options()
        self.assertEqual(opts["backend"], "host")
        self.assertEqual(opts["host_devices"], "2")
        self.assertEqual(opts["timeline"], "true")
        self.assertIn("# ", tally.options_text())

    def test_configure_runtime_keys(self):
        tally.configure({"leak_exitcode": 9, "release_at_stage_end": False})
        self.assertEqual(tally.options()["leak_exitcode"], "9")
        tally.configure("leak_exitcode:0")
        self.assertEqual(tally.options()["leak_exitcode"], "0")

    def test_bad_configuration(self):
        with self.assertRaises(tally.TallyError) as cm:
            tally.configure("no_such_key:1")
        self.assertEqual(cm.exception.code_name, "ECONF")
        self.assertIn("no_such_key", str(cm.exception))
        with self.assertRaises(tally.TallyError):
            tally.configure({"host_devices": 4})  # not a runtime key


class TorchAbiFromPythonTest(unittest.TestCase):
    """The entry points PyTorch calls, called the same way through ctypes."""

    def test_alloc_free_by_record(self):
        self.assertIsNone(lib.tally_torch_alloc(0, 0, None))
        before = tally.memory_stats(1)["allocation.all.current"]
        p = lib.tally_torch_alloc(1 << 16, 1, ctypes.c_void_p(0x77))
        self.assertTrue(p)
        lib.tally_torch_free(ctypes.c_void_p(p), 123, 0, None)  # wrong size and device
        self.assertEqual(tally.memory_stats(1)["allocation.all.current"], before)
        tally.check()

    def test_hooks(self):
        p = lib.tally_torch_alloc(3 << 20, 0, None)
        lib.tally_torch_free(ctypes.c_void_p(p), 3 << 20, 0, None)
        lib.tally_torch_empty_cache()
        self.assertEqual(tally.memory_reserved(0), 0)
        lib.tally_torch_init(2)
        lib.tally_torch_memory_fraction(ctypes.c_double(1.0), 0)
        self.assertIn(lib.tally_torch_oom_raises(), (0, 1))


if __name__ == "__main__":
    unittest.main()
