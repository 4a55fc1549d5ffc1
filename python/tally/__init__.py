"""tally: a caching GPU memory allocator that knows who owns every byte.

The Python side of tally (standard library and ctypes only; PyTorch is
optional)::

    import tally
    tally.install()                      # before any CUDA use
    with tally.stage("load"), tally.tag("weights"):
        model = build().cuda()
    print(tally.memory_summary())        # torch.cuda.memory_summary's table
    print(tally.ledger_text())           # who holds what, by tag and stage

Or, without changing the program: ``python -m tally run train.py args...``.
docs/pytorch.md is the guide.
"""

from __future__ import annotations

from ._ledger import ignore, stage, tag
from ._lib import TallyError, library, library_path
from ._lib import last_error as _last_error
from ._options import configure, options, options_text
from ._sleep import asleep, sleep, sleep_info, wake
from ._reports import (
    dump_snapshot,
    leaks,
    leaks_text,
    ledger,
    ledger_text,
    load_report,
    report,
    snapshot,
    snapshot_from_report,
    write_report,
)
from ._stats import (
    device_index,
    empty_cache,
    get_per_process_memory_fraction,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    mem_get_info,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from ._torch import PATCHED_NAMES, install, installed, patch_torch, unpatch_torch

__version__ = "0.1.0"

__all__ = [
    "TallyError",
    "asleep",
    "backend",
    "check",
    "configure",
    "device_count",
    "device_index",
    "dump_snapshot",
    "empty_cache",
    "get_per_process_memory_fraction",
    "ignore",
    "install",
    "installed",
    "leaks",
    "leaks_text",
    "ledger",
    "ledger_text",
    "library",
    "library_path",
    "load_report",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "mem_get_info",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "options",
    "options_text",
    "patch_torch",
    "PATCHED_NAMES",
    "report",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "sleep",
    "sleep_info",
    "snapshot",
    "snapshot_from_report",
    "stage",
    "tag",
    "unpatch_torch",
    "version",
    "wake",
    "write_report",
]


def version() -> str:
    """The loaded library's version (tally_version)."""
    return library().tally_version().decode()


def backend() -> str:
    """The backend in use: "cuda", "async" or "host" (starts tally)."""
    return library().tally_backend_name().decode()


def device_count() -> int:
    """Number of devices tally's backend exposes (starts tally)."""
    n = library().tally_device_count()
    if n < 0:
        raise TallyError(_last_error(), -n)
    return n


def check() -> None:
    """Verify the allocator's invariants (tally_check); TallyError names the
    first violation."""
    rc = library().tally_check()
    if rc < 0:
        raise TallyError(_last_error(), -rc)
