"""The out-of-memory exception PyTorch expects: ``c10::OutOfMemoryError``.

libtally.so raises ``std::runtime_error`` when an allocation fails
(lib/torch/torch_oom.cc): Python then sees a ``RuntimeError``, and cuDNN, which
catches only ``c10::OutOfMemoryError`` to retry with a smaller workspace,
fails instead of falling back. The exception type lives in PyTorch's libc10,
which tally does not link, so this module compiles a small C++ shim
(``_oom_shim.cc`` beside it) against the installed torch's headers and
libraries (``torch.utils.cpp_extension.include_paths()`` /
``library_paths()``) with the system C++ compiler (``$CXX``, else ``c++``),
once: the result is cached under ``$XDG_CACHE_HOME/tally`` (else
``~/.cache/tally``; ``$TALLY_CACHE_DIR`` overrides), keyed by the torch
version, its C++ ABI and the shim's source. ``tally.install()`` loads it and
hands its raise function to the library (``tally_torch_set_oom_raiser``).
Nothing is downloaded. Without torch, a compiler or a successful build, the
``std::runtime_error`` fallback stays in force and ``state()`` says why;
``TALLY_OOM_SHIM=0`` turns the shim off.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

from ._lib import has, library

__all__ = ["SOURCE", "SYMBOL", "cache_dir", "find_or_build", "install", "state", "describe"]

SOURCE = Path(__file__).resolve().with_name("_oom_shim.cc")
SYMBOL = "tally_oom_shim_raise"
C10_OOM = "c10::OutOfMemoryError"
RUNTIME_ERROR = "std::runtime_error"
NULL = "NULL"

# (kind, detail) of what tally_torch_alloc raises in this process, once
# install() ran; None before.
_state: Optional[Tuple[str, str]] = None
_loaded: List[ctypes.CDLL] = []  # the shim stays loaded: libtally.so calls into it


def cache_dir() -> Path:
    """Where built shims are kept."""
    env = os.environ.get("TALLY_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tally"


def _compiler() -> Tuple[Optional[str], str]:
    env = os.environ.get("CXX")
    if env:
        found = shutil.which(env)
        return (found, "") if found else (None, f"no C++ compiler: CXX={env} is not found")
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found, ""
    return None, "no C++ compiler (c++, g++ or clang++ on PATH, or $CXX)"


def _torch_build_info(torch: Any) -> Tuple[Optional[Tuple[List[str], List[str], bool]], str]:
    try:
        from torch.utils import cpp_extension  # type: ignore

        includes = [str(p) for p in cpp_extension.include_paths()]
        libs = [str(p) for p in cpp_extension.library_paths()]
    except Exception as e:
        # cpp_extension imports setuptools, which an environment may lack:
        # the wheel's own layout (torch/include, torch/lib) is what it returns.
        base = Path(getattr(torch, "__file__", None) or "/nonexistent").parent
        if not (base / "include" / "c10" / "util" / "Exception.h").is_file():
            return None, f"torch.utils.cpp_extension is unavailable ({e})"
        includes, libs = [str(base / "include")], [str(base / "lib")]
    header = [p for p in includes if os.path.isfile(os.path.join(p, "c10", "util", "Exception.h"))]
    if not header:
        return None, f"torch's headers are not installed (no c10/util/Exception.h under {', '.join(includes)})"
    abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return (includes, libs, abi), ""


def _key(torch: Any, compiler: str, includes: List[str], abi: bool) -> str:
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    for part in (str(getattr(torch, "__version__", "?")), compiler, str(abi), *includes):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def find_or_build(torch: Any) -> Tuple[Optional[Path], str]:
    """The shim for this torch: (path, "cached ..." / "built ...") or
    (None, why not)."""
    if os.environ.get("TALLY_OOM_SHIM", "1") == "0":
        return None, "the shim is turned off (TALLY_OOM_SHIM=0)"
    if torch is None:
        return None, "PyTorch is not installed"
    info, why = _torch_build_info(torch)
    if info is None:
        return None, why
    includes, libs, abi = info
    cxx, why = _compiler()
    if cxx is None:
        return None, why
    version = re.sub(r"[^A-Za-z0-9.]+", "_", str(getattr(torch, "__version__", "unknown")))
    folder = cache_dir()
    path = folder / f"oom_shim-torch{version}-{_key(torch, cxx, includes, abi)}.so"
    if path.is_file():
        return path, f"cached {path}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".build-lock", "a")
    except OSError as e:
        return None, f"cannot use the cache folder {folder} ({e})"
    with lock:
        # Ranks starting together: one builds, the others wait and find it.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path, f"cached {path}"
        return _build(path, cxx, includes, libs, abi)


def _build(path: Path, cxx: str, includes: List[str], libs: List[str], abi: bool) -> Tuple[Optional[Path], str]:
    folder = path.parent
    started = time.monotonic()
    log = path.with_suffix(".log")
    errors = []
    for std in ("c++17", "c++20"):
        # Built beside its final name and renamed: ranks starting together
        # never load a half-written file.
        fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=folder)
        os.close(fd)
        cmd = [cxx, f"-std={std}", "-O2", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(abi)}"]
        cmd += [f"-I{p}" for p in includes] + [str(SOURCE), "-o", tmp]
        cmd += [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs] + ["-lc10"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            os.unlink(tmp)
            return None, f"compiling the shim failed to run ({e})"
        if r.returncode == 0:
            os.replace(tmp, path)
            return path, f"built {path} in {time.monotonic() - started:.1f} s"
        os.unlink(tmp)
        errors.append(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    log.write_text("\n".join(errors))
    first = next((line for line in errors[0].splitlines() if "error" in line), "see the log")
    return None, f"compiling the shim failed: {first.strip()} (full output: {log})"


def install(torch: Any) -> Tuple[str, str]:
    """Build or find the shim, load it and make libtally.so raise through it.
    Returns (kind, detail): kind is "c10::OutOfMemoryError", or the fallback
    "std::runtime_error" (or "NULL" for a library built without
    torch_oom.cc), detail says where the shim is or why it is not used."""
    global _state
    if _state is not None and _state[0] == C10_OOM:
        return _state
    if not has("tally_torch_set_oom_raiser"):
        path, why = None, "this libtally.so has no tally_torch_set_oom_raiser"
    else:
        path, why = find_or_build(torch)
    if path is not None:
        try:
            shim = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
            address = ctypes.cast(getattr(shim, SYMBOL), ctypes.c_void_p).value
        except (OSError, AttributeError) as e:
            path, why = None, f"the shim at {path} cannot be loaded ({e}); delete it to rebuild"
        else:
            _loaded.append(shim)
            library().tally_torch_set_oom_raiser(address)
            _state = (C10_OOM, why)
            return _state
    fallback = RUNTIME_ERROR if library().tally_torch_oom_raises() else NULL
    _state = (fallback, why)
    return _state


def state() -> Optional[Tuple[str, str]]:
    """(kind, detail) once install() ran in this process, else None."""
    return _state


def describe(kind: str, detail: str) -> str:
    """One line for ``python -m tally info``."""
    if kind == C10_OOM:
        return f"raises {C10_OOM} (Python: torch.cuda.OutOfMemoryError) through the shim: {detail}"
    if kind == RUNTIME_ERROR:
        return f"raises {RUNTIME_ERROR} (Python: RuntimeError), the fallback: {detail}"
    return f"returns NULL (libtally.so built without torch_oom.cc): {detail}"


if __name__ == "__main__":  # python -m tally._oom_shim: build (or find) it for the torch installed
    try:
        import torch as _torch  # type: ignore
    except ImportError:
        _torch = None
    found, note = find_or_build(_torch)
    print(note)
    sys.exit(0 if found else 1)
