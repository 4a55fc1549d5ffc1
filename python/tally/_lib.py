"""Loading libtally.so and calling its C API through ctypes.

The library is looked up, in order, at:

1. ``$TALLY_LIB`` (a path to the file): when it is set, only there; a file
   that is missing or cannot be loaded is an error naming it, never a
   silent fall back to another library,
2. next to this package (``tally/libtally.so``, where ``pip install`` puts it),
3. the build tree of a source checkout (``<repo>/build/lib/libtally.so``).

It is opened ``RTLD_NOW | RTLD_LOCAL``, as PyTorch opens a pluggable
allocator, and never closed; PyTorch later opening the same file gets the
same instance, so statistics, tags and stages are shared.

Text reports reach Python through a ``tally_write_fn`` callback that only
lives for the duration of one call: the library never keeps a pointer into
Python, so it stays safe while the interpreter shuts down.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path
from typing import List, Optional

__all__ = ["TallyError", "library", "library_path", "has", "last_error", "check", "call", "collect_text"]

# Error codes of include/tally.h (returned negated).
ERROR_NAMES = {
    1: "EINVAL",
    2: "ENOMEM",
    3: "ECONF",
    4: "EBACKEND",
    5: "ESTATE",
    6: "EIO",
}

# void (*tally_write_fn)(void *arg, const char *text, size_t len)
WRITE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)


class TallyError(RuntimeError):
    """A tally C API call failed; ``code`` is the positive TALLY_E* code."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code

    @property
    def code_name(self) -> str:
        return ERROR_NAMES.get(self.code, str(self.code))


def _candidates() -> List[Path]:
    here = Path(__file__).resolve().parent
    found = []
    env = os.environ.get("TALLY_LIB")
    if env:
        return [Path(env)]
    found.append(here / "libtally.so")
    found.append(here.parent.parent / "build" / "lib" / "libtally.so")
    return found


_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None

_c = ctypes
_SIGNATURES = {
    # name: (restype, argtypes)
    "tally_version": (_c.c_char_p, []),
    "tally_init": (_c.c_int, []),
    "tally_configure": (_c.c_int, [_c.c_char_p]),
    "tally_write_options": (_c.c_int, [WRITE_FN, _c.c_void_p]),
    "tally_last_error": (_c.c_char_p, []),
    "tally_set_sink": (None, [WRITE_FN, _c.c_void_p]),
    "tally_backend_name": (_c.c_char_p, []),
    "tally_device_count": (_c.c_int, []),
    "tally_malloc": (_c.c_void_p, [_c.c_size_t, _c.c_int, _c.c_void_p]),
    "tally_free": (None, [_c.c_void_p]),
    "tally_ignore": (_c.c_int, [_c.c_void_p]),
    "tally_free_checked": (_c.c_int, [_c.c_void_p, _c.c_size_t, _c.c_int]),
    "tally_record_stream": (_c.c_int, [_c.c_void_p, _c.c_void_p]),
    "tally_empty_cache": (_c.c_size_t, [_c.c_int]),
    "tally_set_memory_fraction": (_c.c_int, [_c.c_double, _c.c_int]),
    "tally_get_memory_fraction": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_double)]),
    "tally_mem_get_info": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_size_t), _c.POINTER(_c.c_size_t)]),
    "tally_check": (_c.c_int, []),
    "tally_get_stats": (_c.c_int, [_c.c_int, _c.c_void_p]),
    "tally_reset_peak_stats": (_c.c_int, [_c.c_int]),
    "tally_reset_accumulated_stats": (_c.c_int, [_c.c_int]),
    "tally_write_stats_json": (_c.c_int, [_c.c_int, WRITE_FN, _c.c_void_p]),
    "tally_tag_push": (_c.c_int, [_c.c_char_p]),
    "tally_tag_pop": (_c.c_int, []),
    "tally_stage_begin": (_c.c_int, [_c.c_char_p]),
    "tally_stage_end": (_c.c_int, [_c.c_char_p]),
    "tally_write_summary": (_c.c_int, [_c.c_int, _c.c_int, WRITE_FN, _c.c_void_p]),
    "tally_write_ledger": (_c.c_int, [WRITE_FN, _c.c_void_p]),
    "tally_write_leaks": (_c.c_int, [_c.c_int, WRITE_FN, _c.c_void_p]),
    "tally_write_report": (_c.c_int, [_c.c_char_p]),
    "tally_torch_alloc": (_c.c_void_p, [_c.c_size_t, _c.c_int, _c.c_void_p]),
    "tally_torch_free": (None, [_c.c_void_p, _c.c_size_t, _c.c_int, _c.c_void_p]),
    "tally_torch_init": (None, [_c.c_int]),
    "tally_torch_empty_cache": (None, []),
    "tally_torch_memory_fraction": (None, [_c.c_double, _c.c_int]),
    "tally_torch_record_stream": (None, [_c.c_void_p, _c.c_void_p]),
    "tally_torch_oom_raises": (_c.c_int, []),
    "tally_graph_captures_announced": (None, []),
    "tally_torch_set_oom_raiser": (None, [_c.c_void_p]),
    "tally_torch_base_alloc": (_c.c_void_p, [_c.c_void_p, _c.POINTER(_c.c_size_t)]),
    "tally_backend_started": (_c.c_int, []),
    "tally_host_stream_hold": (_c.c_int, [_c.c_void_p, _c.c_int]),
    "tally_host_fail_alloc": (_c.c_int, [_c.c_uint64, _c.c_uint64]),
}


def _open() -> ctypes.CDLL:
    tried = []
    env = os.environ.get("TALLY_LIB")
    for path in _candidates():
        if not path.is_file():
            if env:
                raise ImportError(f"TALLY_LIB={env}: no such file (unset TALLY_LIB to use the installed library)")
            tried.append(f"{path} (absent)")
            continue
        try:
            lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            if env:
                raise ImportError(f"TALLY_LIB={env}: cannot be loaded: {e}") from None
            tried.append(f"{path} ({e})")
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = restype
                fn.argtypes = argtypes
        global _path
        _path = str(path)
        return lib
    raise ImportError(
        "cannot find libtally.so; build it with `make lib` in the source tree, "
        "install the package with `pip install ./python`, or set TALLY_LIB to its path. Tried: "
        + "; ".join(tried)
    )


def library() -> ctypes.CDLL:
    """The loaded library (opened on first use)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _open()
    return _lib


def library_path() -> str:
    """Absolute path of the loaded libtally.so."""
    library()
    assert _path is not None
    return _path


def has(name: str) -> bool:
    """Whether the loaded library exports the function ``name``."""
    return getattr(library(), name, None) is not None


def last_error() -> str:
    """The message of the last failed call on this thread."""
    msg = library().tally_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(rc: int, what: str) -> int:
    """Raise TallyError for a negative return code; return rc otherwise."""
    if rc < 0:
        msg = last_error() or f"{what} failed"
        raise TallyError(msg, -rc)
    return rc


def call(name: str, *args) -> int:
    """Call an int-returning C function and raise TallyError on failure."""
    return check(getattr(library(), name)(*args), name)


def collect_text(name: str, *args) -> str:
    """Call a C function whose last two arguments are (write, arg) and return
    the text it wrote."""
    parts: List[bytes] = []

    def write(_arg, text, length):
        parts.append(ctypes.string_at(text, length))

    callback = WRITE_FN(write)  # kept alive until the call returns
    check(getattr(library(), name)(*args, callback, None), name)
    return b"".join(parts).decode("utf-8", "replace")


def encode(name: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"tally: expected a str name, got {type(name).__name__}")
    return name.encode("utf-8")


# ---- tally_stats_t, read without mirroring the whole struct ---------------
#
# The pool-indexed stats come first in the struct, in TALLY_POOL_STATS order,
# each an array of 3 pools x {current, peak, allocated, freed} int64. A buffer
# much larger than the struct is passed, so fields added at its end in later
# versions cannot overflow it. tests/ cross-checks these offsets against the
# JSON statistics.
POOL_STATS = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
_STATS_BUFFER = 8192


def pool_stat(device: int, stat: str, field: str, pool: str = "all") -> int:
    """One field of tally_get_stats: e.g. ("allocated_bytes", "peak")."""
    buf = ctypes.create_string_buffer(_STATS_BUFFER)
    call("tally_get_stats", device, ctypes.cast(buf, ctypes.c_void_p))
    index = (POOL_STATS.index(stat) * len(POOLS) + POOLS.index(pool)) * len(FIELDS) + FIELDS.index(field)
    return struct.unpack_from("=q", buf.raw, index * 8)[0]

