"""Helpers shared by the tests: paths and running Python in a subprocess
with the package importable and libtally.so found."""

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

PYTHON_DIR = Path(__file__).resolve().parent.parent
REPO = PYTHON_DIR.parent


def child_env(conf: Optional[str] = None, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["TALLY_CONF"] = conf if conf is not None else "backend:host,host_devices:2,host_capacity:1GiB"
    env.update(extra)
    return env


def run_python(args: List[str], conf: Optional[str] = None, cwd: Optional[str] = None, timeout: int = 120,
               **extra: str) -> subprocess.CompletedProcess:
    """Run `python3 ARGS` with the package on the path; text output."""
    return subprocess.run([sys.executable, *args], env=child_env(conf, **extra), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
