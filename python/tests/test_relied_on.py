"""Behaviours of the Python package that users rely on and that no other test
pinned down (issue 25): the peak a device reserved, and the exit status of
``python -m tally run`` when the program both fails and leaks. Each runs
``python -m tally run`` in a subprocess on the host backend."""

import os
import tempfile
import textwrap
import unittest

from . import support

# Device 1 reserves memory, then gives all of it back; device 0 is never used.
RESERVE_THEN_RELEASE = textwrap.dedent(
    """\
    import tally
    lib = tally.library()
    p = lib.tally_malloc(3 << 20, 1, None)
    lib.tally_free(p)
    tally.empty_cache()
    print("reserved", tally.memory_reserved(1), "peak", tally.max_memory_reserved(1),
          "peak allocated", tally.max_memory_allocated(1))
    """
)

# A program that leaks a block, then fails in the way given by FAIL.
LEAK_THEN_FAIL = textwrap.dedent(
    """\
    import sys
    import tally
    lib = tally.library()
    kept = lib.tally_malloc(1 << 20, 0, None)
    FAIL
    """
)


class ReliedOnTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, text, conf=None):
        path = os.path.join(self.dir, "prog.py")
        with open(path, "w") as f:
            f.write(text)
        return support.run_python(["-m", "tally", "run", path], conf=conf, cwd=self.dir)

    def test_max_memory_reserved_is_the_peak_and_run_summarises_a_device_that_released_all(self):
        r = self.run_script(RESERVE_THEN_RELEASE)
        self.assertEqual(r.returncode, 0, r.stderr)
        words = r.stdout.split()
        reserved = int(words[words.index("reserved") + 1])
        peak = int(words[words.index("peak") + 1])
        self.assertEqual(reserved, 0, r.stdout)
        # 3 MiB rounds up to one 20 MiB large-pool segment (PyTorch's rule).
        self.assertEqual(peak, 20 << 20, r.stdout)
        # The summary at exit covers device 1, which held memory, and not
        # device 0, which never did.
        self.assertIn("memory summary, device ID 1 ", r.stderr)
        self.assertNotIn("device ID 0 ", r.stderr)
        self.assertNotIn("no device memory was used", r.stderr)

    def test_run_keeps_a_failing_programs_exit_status_when_it_also_leaks(self):
        conf = "backend:host,host_devices:1,host_capacity:1GiB,leak_exitcode:23"
        for fail, want in (("sys.exit(5)", 5), ("raise RuntimeError('boom')", 1), ("pass", 23)):
            with self.subTest(fail=fail):
                r = self.run_script(LEAK_THEN_FAIL.replace("FAIL", fail), conf=conf)
                # The leak is reported either way ...
                self.assertIn("tally: SUMMARY: 1048576 bytes leaked in 1 block", r.stderr)
                # ... but its exit code only replaces a success.
                self.assertEqual(r.returncode, want, r.stderr)

    def test_leak_report_keeps_a_frame_line_longer_than_1024_bytes(self):
        # A script deep in folders: its frame line in the leak report is over
        # 1100 bytes, past the report writer's first buffer.
        deep = os.path.join(self.dir, *(["d" * 220] * 5))
        os.makedirs(deep)
        path = os.path.join(deep, "deep.py")
        with open(path, "w") as f:
            f.write("import tally\nlib = tally.library()\n\n\ndef alloc_deep():\n"
                    "    return lib.tally_malloc(1 << 20, 0, None)\n\n\nkept = alloc_deep()\n")
        r = support.run_python([path], conf="backend:host,host_devices:1,host_capacity:1GiB,leak_report:full,"
                               "python_stack:4", cwd=self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        want = "in alloc_deep %s:6 (python)\n" % path
        self.assertGreater(len(want), 1100)
        self.assertIn(want, r.stderr)
        self.assertIn("tally: SUMMARY: 1048576 bytes leaked in 1 block", r.stderr)


if __name__ == "__main__":
    unittest.main()
