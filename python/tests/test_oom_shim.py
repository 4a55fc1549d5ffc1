"""The OOM shim (tally/_oom_shim.py): built against a stand-in for PyTorch
made here (a ``torch`` package whose ``torch.utils.cpp_extension`` points at
a small ``c10/util/Exception.h`` and a ``libc10.so`` compiled by the test),
so the build, the cache, the fallbacks, the exception that reaches the
caller and ``python -m tally info`` are all tested without torch."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

from . import support

CXX = shutil.which("c++") or shutil.which("g++")

HEADER = """\
#pragma once
#include <cstdint>
#include <exception>
#include <string>
namespace c10 {
struct SourceLocation { const char *function; const char *file; uint32_t line; };
class Error : public std::exception {
    std::string msg_;
public:
    Error(SourceLocation where, std::string msg);  // defined in libc10, as in PyTorch
    const char *what() const noexcept override { return msg_.c_str(); }
};
class OutOfMemoryError : public Error { using Error::Error; };
}
"""

LIBC10 = """\
#include <c10/util/Exception.h>
c10::Error::Error(SourceLocation where, std::string msg) : msg_(msg + " [from " + where.function + "]") {}
"""

TORCH_INIT = """\
import types
__version__ = "{version}"
version = types.SimpleNamespace(cuda="13.0")
_C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
"""

CPP_EXTENSION = """\
def include_paths():
    return [{include!r}]
def library_paths():
    return [{lib!r}]
"""

# Loads a shim and calls its raise function; says which c10 type it caught.
DRIVER = """\
#include <c10/util/Exception.h>
#include <cstdio>
#include <dlfcn.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { std::printf("dlopen: %s\\n", dlerror()); return 2; }
    auto raise = reinterpret_cast<void (*)(int, const char *)>(dlsym(h, "tally_oom_shim_raise"));
    for (int oom = 1; oom >= 0; oom--) {
        try { raise(oom, "CUDA out of memory. test"); }
        catch (const c10::OutOfMemoryError &e) { std::printf("OutOfMemoryError: %s\\n", e.what()); }
        catch (const c10::Error &e) { std::printf("Error: %s\\n", e.what()); }
    }
    return 0;
}
"""


@unittest.skipUnless(CXX, "needs a C++ compiler")
class OomShimTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="tally-shim-"))
        include, lib = cls.root / "include", cls.root / "lib"
        (include / "c10" / "util").mkdir(parents=True)
        (include / "c10" / "util" / "Exception.h").write_text(HEADER)
        lib.mkdir()
        (cls.root / "c10.cc").write_text(LIBC10)
        subprocess.run([CXX, "-std=c++17", "-shared", "-fPIC", f"-I{include}", str(cls.root / "c10.cc"),
                        "-o", str(lib / "libc10.so")], check=True)
        cls.include, cls.lib = include, lib
        cls.site = cls.make_torch("2.99.0", cls.root / "site")
        # A compiler wrapper that counts its runs.
        cls.count = cls.root / "cxx-runs"
        cls.wrapper = cls.root / "cxx"
        cls.wrapper.write_text(f"#!/bin/sh\necho run >> {cls.count}\nexec {CXX} \"$@\"\n")
        cls.wrapper.chmod(0o755)

    @classmethod
    def make_torch(cls, version, site, include=None):
        pkg = site / "torch"
        (pkg / "utils").mkdir(parents=True)
        (pkg / "__init__.py").write_text(TORCH_INIT.format(version=version))
        (pkg / "utils" / "__init__.py").write_text("")
        (pkg / "utils" / "cpp_extension.py").write_text(
            CPP_EXTENSION.format(include=str(include or cls.include), lib=str(cls.lib)))
        return site

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def py(self, code, site=None, cache=None, **env):
        env.setdefault("TALLY_CACHE_DIR", str(cache or tempfile.mkdtemp(dir=self.root)))
        env["PYTHONPATH"] = os.pathsep.join([str(site or self.site), str(support.PYTHON_DIR)])
        return support.run_python(["-c", textwrap.dedent(code)], **env)

    BUILD = """\
        import torch
        from tally import _oom_shim
        path, note = _oom_shim.find_or_build(torch)
        print("PATH", path)
        print("NOTE", note)
        """

    def test_build_then_cache_hit(self):
        cache = tempfile.mkdtemp(dir=self.root)
        r1 = self.py(self.BUILD, cache=cache, CXX=str(self.wrapper))
        self.assertEqual(r1.returncode, 0, r1.stderr)
        self.assertIn("NOTE built ", r1.stdout)
        path = r1.stdout.split("PATH ", 1)[1].split("\n", 1)[0]
        self.assertTrue(path.startswith(cache) and "torch2.99.0" in path, path)
        runs = self.count.read_text().count("run")
        r2 = self.py(self.BUILD, cache=cache, CXX=str(self.wrapper))
        self.assertIn(f"NOTE cached {path}", r2.stdout)
        self.assertEqual(self.count.read_text().count("run"), runs)  # no compiler run on a hit
        # Another torch version is another shim.
        other = self.make_torch("3.0.0", self.root / "site3")
        r3 = self.py(self.BUILD, site=other, cache=cache, CXX=str(self.wrapper))
        self.assertIn("NOTE built ", r3.stdout)
        self.assertNotIn(path, r3.stdout)
        # The shim throws c10's types: OutOfMemoryError for oom, Error otherwise.
        driver = self.root / "driver"
        (self.root / "driver.cc").write_text(DRIVER)
        subprocess.run([CXX, "-std=c++17", f"-I{self.include}", str(self.root / "driver.cc"), "-o", str(driver),
                        f"-L{self.lib}", f"-Wl,-rpath,{self.lib}", "-lc10", "-ldl"], check=True)
        out = subprocess.run([str(driver), path], capture_output=True, text=True).stdout
        self.assertIn("OutOfMemoryError: CUDA out of memory. test [from tally_oom_shim_raise]\n", out)
        self.assertIn("Error: CUDA out of memory. test [from tally_oom_shim_raise]\n", out.split("\n", 1)[1])

    def test_without_setuptools_the_wheel_layout_is_used(self):
        # torch.utils.cpp_extension needs setuptools; without it the headers
        # and libraries are found where a torch wheel keeps them.
        site = self.make_torch("2.96.0", self.root / "site-nosetuptools")
        (site / "torch" / "utils" / "cpp_extension.py").write_text("import setuptools_that_is_not_here\n")
        (site / "torch" / "include").symlink_to(self.include)
        (site / "torch" / "lib").symlink_to(self.lib)
        r = self.py(self.BUILD, site=site)
        self.assertIn("NOTE built ", r.stdout, r.stderr)
        (site / "torch" / "include").unlink()
        r = self.py(self.BUILD, site=site)
        self.assertIn("NOTE torch.utils.cpp_extension is unavailable (No module named 'setuptools_that_is_not_here')",
                      r.stdout)

    def test_fallbacks_say_why(self):
        cases = [
            ({"CXX": "/nonexistent/c++"}, "PATH None", "NOTE no C++ compiler: CXX=/nonexistent/c++ is not found"),
            ({"TALLY_OOM_SHIM": "0"}, "PATH None", "NOTE the shim is turned off (TALLY_OOM_SHIM=0)"),
        ]
        for env, path, note in cases:
            r = self.py(self.BUILD, **env)
            self.assertIn(path, r.stdout, env)
            self.assertIn(note, r.stdout, env)
        r = self.py("from tally import _oom_shim\nprint(_oom_shim.find_or_build(None))\n")
        self.assertIn("(None, 'PyTorch is not installed')", r.stdout)
        # Headers that do not compile: the reason names the error and the log.
        broken = self.root / "broken-include" / "c10" / "util"
        broken.mkdir(parents=True, exist_ok=True)
        (broken / "Exception.h").write_text("#error this c10 is broken\n")
        site = self.make_torch("2.98.0", self.root / "site-broken", include=self.root / "broken-include")
        r = self.py(self.BUILD, site=site)
        self.assertIn("NOTE compiling the shim failed: ", r.stdout)
        self.assertIn("this c10 is broken", r.stdout)
        log = r.stdout.split("(full output: ", 1)[1].split(")", 1)[0]
        self.assertTrue(Path(log).is_file(), log)
        # No headers at all.
        site = self.make_torch("2.97.0", self.root / "site-noheaders", include=self.root / "nowhere")
        r = self.py(self.BUILD, site=site)
        self.assertIn("NOTE torch's headers are not installed", r.stdout)

    def test_alloc_raises_through_the_shim(self):
        # A C++ exception cannot cross into Python through ctypes: the process
        # ends in std::terminate, which names the exception's type.
        code = """\
            import torch, tally
            from tally import _oom_shim
            kind, detail = _oom_shim.install(torch if {shim} else None)
            print(kind, flush=True)
            tally.library().tally_torch_alloc(1 << 50, 0, None)
            """
        r = self.py(code.format(shim=True))
        self.assertIn("c10::OutOfMemoryError\n", r.stdout)
        self.assertIn("c10::OutOfMemoryError", r.stderr)
        self.assertIn("CUDA out of memory. Tried to allocate 1.00 PiB on device 0.", r.stderr)
        r = self.py(code.format(shim=False))
        self.assertIn("std::runtime_error\n", r.stdout)
        self.assertIn("tally_out_of_memory", r.stderr)  # torch_oom.cc's std::runtime_error subclass

    def test_info_says_which_exception(self):
        r = self.py("import sys; from tally._cli import main; sys.exit(main(['info']))")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("out-of-memory in PyTorch: raises c10::OutOfMemoryError (Python: torch.cuda.OutOfMemoryError)"
                      " through the shim: built ", r.stdout)
        self.assertIn("PyTorch: 2.99.0 (CUDA 13.0)", r.stdout)
        r = self.py("import sys; from tally._cli import main; sys.exit(main(['info']))", CXX="/nonexistent/c++")
        self.assertIn("out-of-memory in PyTorch: raises std::runtime_error (Python: RuntimeError), the fallback: "
                      "no C++ compiler: CXX=/nonexistent/c++ is not found\n", r.stdout)


if __name__ == "__main__":
    unittest.main()
