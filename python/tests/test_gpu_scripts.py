"""The GPU scripts (bench/gpu/) cannot run here, but they must parse, compile
and, without a GPU or with --dry-run, end in SKIP lines with status 0, so a
GPU lease is never spent on a typo."""

import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from . import support

GPU = support.REPO / "bench" / "gpu"
STEPS = ("build", "make-test", "contexts", "last_error", "graph", "graph-async", "conv", "train-tally", "train-native",
         "ipc", "ipc-expandable", "empty-cache", "torch-workload")


class GpuScriptsTest(unittest.TestCase):
    def test_shell_scripts_parse(self):
        scripts = sorted(GPU.glob("*.sh"))
        self.assertIn(GPU / "run_all.sh", scripts)
        for script in scripts:
            r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"{script}: {r.stderr}")

    def test_python_files_compile(self):
        files = sorted(GPU.glob("*.py"))
        self.assertIn(GPU / "torch_checks.py", files)
        with tempfile.TemporaryDirectory() as d:
            for f in files:
                py_compile.compile(str(f), cfile=os.path.join(d, f.name + "c"), doraise=True)
        with tempfile.TemporaryDirectory() as work:
            r = subprocess.run(["bash", str(GPU / "torch_check.sh"), "--compile-only"], capture_output=True,
                               text=True, env=dict(os.environ, TALLY_CHECK_DIR=work), timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def dry_run(self, *args):
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run(["bash", str(GPU / "run_all.sh"), *args], capture_output=True, text=True,
                               env=dict(os.environ, OUT=out), timeout=60)
            summary = Path(out, "summary.txt").read_text()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for step in STEPS:
            self.assertIn(f"SKIP {step}: ", summary)
        self.assertNotIn("PASS", summary)
        self.assertNotIn("FAIL", summary)
        return r.stdout, summary

    def test_dry_run_skips_everything(self):
        out, summary = self.dry_run("--dry-run")
        self.assertIn("SKIP gpu: dry run\n", summary)
        self.assertIn(f"== 0 passed, 0 failed, {len(STEPS) + 1} skipped", out)

    @unittest.skipIf(shutil.which("nvidia-smi"), "this machine has nvidia-smi: the real run is run_all.sh's job")
    def test_no_gpu_says_so(self):
        _, summary = self.dry_run()
        self.assertIn("SKIP gpu: no NVIDIA GPU on this machine", summary)

    def test_torch_checks_without_torch_or_with_a_bad_name(self):
        r = subprocess.run([sys.executable, str(GPU / "torch_checks.py"), "nonsense"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown check nonsense", r.stdout)
        try:
            import torch  # noqa: F401
        except ImportError:
            r = subprocess.run([sys.executable, str(GPU / "torch_checks.py"), "graph"], capture_output=True,
                               text=True)
            self.assertEqual((r.returncode, r.stdout), (0, "SKIP graph: PyTorch is not installed\n"))


if __name__ == "__main__":
    unittest.main()
