"""The tally package's build backend (PEP 517 and PEP 660), standard library
only, so ``pip install ./python`` works offline and needs nothing from a
package index (not setuptools, not wheel).

The wheel holds the ``tally`` package, ``libtally.so`` and the ``tally``
command-line tool (``tally/bin/tally``, which ``python -m tally merge`` runs)
inside it. The library comes from ``$TALLY_LIB``, else from the source
tree's ``build/lib/libtally.so``; the tool from ``$TALLY_CLI``, else from
``build/bin/tally``; when they are missing and the source tree is there,
``make -C <repo> lib build/bin/tally`` is run first. An editable install (``pip install -e``)
points at the source tree instead, where the package finds the library in
``build/lib``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

NAME = "tally"
VERSION = "0.1.0"
SUMMARY = "A caching GPU memory allocator that knows who owns every byte: PyTorch integration and reports"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIB_NAME = "libtally.so"
CLI_NAME = "tally"

METADATA = f"""\
Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: {SUMMARY}
Requires-Python: >=3.8
Provides-Extra: torch
Requires-Dist: torch; extra == "torch"

tally's Python package: a ctypes binding of libtally.so, the PyTorch
pluggable-allocator integration and the reports. See docs/pytorch.md.
"""


def _tag() -> str:
    # Python-version independent (ctypes, no extension module), but the
    # library inside is built for this platform.
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{platform}"


def _dist_info() -> str:
    return f"{NAME}-{VERSION}.dist-info"


def _built(env_name: str, relative: str, what: str) -> Path:
    """$env_name if set (it must be a file), else <repo>/relative, made with
    make when the source tree is there and it is missing."""
    env = os.environ.get(env_name)
    if env:
        path = Path(env)
        if not path.is_file():
            raise RuntimeError(f"tally: {env_name}={env} is not a file")
        return path
    built = REPO / relative
    if not built.is_file() and (REPO / "Makefile").is_file():
        print(f"tally: {built} is missing; running make -C {REPO} lib {relative}", flush=True)
        subprocess.check_call(["make", "-C", str(REPO), "lib", relative])
    if not built.is_file():
        raise RuntimeError(
            f"tally: cannot find {what}: run `make` in the source tree first, or set {env_name} to its path"
        )
    return built


def _library() -> Path:
    return _built("TALLY_LIB", f"build/lib/{LIB_NAME}", LIB_NAME)


def _command() -> Path:
    return _built("TALLY_CLI", f"build/bin/{CLI_NAME}", f"the {CLI_NAME} command-line tool")


def _package_files() -> List[Tuple[str, Path]]:
    files = []
    # The .cc is the OOM shim's source, compiled against torch at install().
    for path in sorted([*(HERE / NAME).rglob("*.py"), *(HERE / NAME).rglob("*.cc")]):
        files.append((path.relative_to(HERE).as_posix(), path))
    return files


class _WheelWriter:
    """A wheel: files plus the dist-info with its RECORD."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records: List[str] = []

    @staticmethod
    def _entry(name: str, mode: int) -> zipfile.ZipInfo:
        """A regular file with a fixed date, so two builds give the same bytes."""
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        return info

    def add(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.zip.writestr(self._entry(name, mode), data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append(f"{name},sha256={digest},{len(data)}")

    def close(self, extra_metadata: Optional[Dict[str, str]] = None) -> None:
        info = _dist_info()
        self.add(f"{info}/METADATA", METADATA.encode())
        wheel = f"Wheel-Version: 1.0\nGenerator: tally_build\nRoot-Is-Purelib: false\nTag: {_tag()}\n"
        self.add(f"{info}/WHEEL", wheel.encode())
        for name, text in (extra_metadata or {}).items():
            self.add(f"{info}/{name}", text.encode())
        record = "\n".join(self.records + [f"{info}/RECORD,,"]) + "\n"
        self.zip.writestr(self._entry(f"{info}/RECORD", 0o644), record)
        self.zip.close()


def _wheel_name() -> str:
    return f"{NAME}-{VERSION}-{_tag()}.whl"


# ---- PEP 517 ----------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings=None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None) -> str:
    target = Path(metadata_directory) / _dist_info()
    target.mkdir(parents=True, exist_ok=True)
    (target / "METADATA").write_text(METADATA)
    (target / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: tally_build\nRoot-Is-Purelib: false\nTag: {_tag()}\n")
    return _dist_info()


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    library = _library()
    name = _wheel_name()
    writer = _WheelWriter(Path(wheel_directory) / name)
    for arcname, path in _package_files():
        writer.add(arcname, path.read_bytes())
    writer.add(f"{NAME}/{LIB_NAME}", library.read_bytes(), mode=0o755)
    writer.add(f"{NAME}/bin/{CLI_NAME}", _command().read_bytes(), mode=0o755)
    writer.close()
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    """A wheel with one .pth file that puts the source tree's python/ on
    sys.path; the package then loads ../build/lib/libtally.so."""
    name = _wheel_name()
    writer = _WheelWriter(Path(wheel_directory) / name)
    writer.add(f"__editable__.{NAME}.pth", (str(HERE) + "\n").encode())
    writer.close()
    return name


def build_sdist(sdist_directory, config_settings=None) -> str:
    """The package's sources (without libtally.so: building a wheel from it
    needs TALLY_LIB)."""
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as tar:
        members = [("pyproject.toml", HERE / "pyproject.toml"), ("tally_build.py", HERE / "tally_build.py")]
        members += _package_files()
        for arcname, path in members:
            tar.add(str(path), arcname=f"{base}/{arcname}")
        pkg_info = METADATA.encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    return name
