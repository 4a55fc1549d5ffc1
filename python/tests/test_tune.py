"""``python -m tally tune``: a report recorded from Python with trace:true,
replayed by the tally command under the candidate settings."""

import json
import os
import tempfile
import textwrap
import unittest

from . import support

# Three steps of: two large blocks and a small one, freed out of order.
# Peak live: 48 MiB + 12 MiB + 4 KiB.
WORKLOAD = textwrap.dedent(
    """\
    import tally
    lib = tally.library()
    for step in range(3):
        a = lib.tally_malloc(48 << 20, 0, None)
        b = lib.tally_malloc(12 << 20, 0, None)
        c = lib.tally_malloc(4096, 0, None)
        lib.tally_free(a)
        lib.tally_free(c)
        lib.tally_free(b)
    """
)


class TuneTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def tally(self, *args, conf=None):
        return support.run_python(["-m", "tally", *args], conf=conf, cwd=self.dir)

    def test_tune_a_traced_report(self):
        script = os.path.join(self.dir, "work.py")
        with open(script, "w") as f:
            f.write(WORKLOAD)
        report = os.path.join(self.dir, "work.json")
        r = self.tally("run", "--quiet", "--conf", "trace:true,host_capacity:2GiB", "--report", report, script)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.tally("tune", "--json", "-q", report)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = json.loads(r.stdout)
        self.assertEqual(rows[0]["setting"], "")
        self.assertEqual([row["recommended"] for row in rows].count(True), 1)
        for row in rows:
            self.assertEqual(row["peak_live_bytes"], (48 << 20) + (12 << 20) + 4096)
            self.assertEqual(row["capacity_bytes"], 2 << 30)
            self.assertNotIn("recorded_peak_reserved_bytes", row)
        best = [row for row in rows if row["recommended"]][0]
        self.assertLessEqual(best["peak_reserved_bytes"], rows[0]["peak_reserved_bytes"])

    def test_tune_is_listed_and_passes_options_through(self):
        r = self.tally("--help")
        self.assertIn("tune", r.stdout)
        r = self.tally("tune", "--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("usage: tally tune", r.stdout)
        r = self.tally("tune", "--capacity", "lots", "x.csv")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--capacity 'lots' is not a size", r.stderr)

    def test_tune_errors_are_one_line(self):
        empty = os.path.join(self.dir, "empty.csv")
        with open(empty, "w") as f:
            f.write("op,id,size,stream\n")
        r = self.tally("tune", empty)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stderr.strip().count("\n"), 0, r.stderr)
        self.assertIn("empty trace", r.stderr)


if __name__ == "__main__":
    unittest.main()
