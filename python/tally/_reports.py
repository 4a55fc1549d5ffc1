"""tally's reports from Python: the JSON report (docs/reports.md) parsed into
dicts, the ledger and leak reports as rows or text, and an export of the
report in the format of PyTorch's memory snapshot, which PyTorch's memory
visualiser (``python -m torch.cuda._memory_viz``, pytorch.org/memory_viz)
reads."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Optional

from ._lib import call, collect_text, encode

__all__ = [
    "report",
    "load_report",
    "write_report",
    "ledger",
    "leaks",
    "ledger_text",
    "leaks_text",
    "snapshot",
    "snapshot_from_report",
    "dump_snapshot",
]


def write_report(path: Optional[str] = None) -> None:
    """Write the JSON report to ``path`` (``%p`` becomes the pid, ``%r`` the
    rank); None uses the configured report_path. The file is replaced
    atomically."""
    call("tally_write_report", None if path is None else encode(os.fspath(path)))


def load_report(path: str) -> Dict[str, Any]:
    """Read a JSON report written by any tally process; ValueError naming
    the file and the problem (missing, malformed, not a tally report)."""
    from . import viz

    return viz.load_report(path)


def report() -> Dict[str, Any]:
    """This process's JSON report, now, as a dict (keys: pid, rank, devices,
    ledger, stages, leaks, segments, timeline, ...)."""
    with tempfile.TemporaryDirectory(prefix="tally-") as tmp:
        path = os.path.join(tmp, "report.json")
        write_report(path)
        return load_report(path)


def ledger() -> List[Dict[str, Any]]:
    """The ledger rows: one per (tag, stage, device) with current_bytes,
    peak_bytes, allocated_bytes, freed_bytes, live_blocks, peak_blocks,
    allocated_blocks and whether the device is foreign to this process."""
    return report()["ledger"]


def leaks() -> List[Dict[str, Any]]:
    """Every live block, grouped by (tag, stage, device, site), largest
    first: what the exit report would call leaks if the process ended now.
    Each group's ``frames`` is its allocation site's frames (Python frames
    first, then native; empty without python_stack / backtrace_depth)."""
    doc = report()
    sites = {s["id"]: s["frames"] for s in doc.get("sites", [])}
    for group in doc["leaks"]:
        group["frames"] = sites.get(group.get("site_id"), [])
    return doc["leaks"]


def ledger_text() -> str:
    """The ledger table and the stage history, as tally prints them."""
    return collect_text("tally_write_ledger")


def leaks_text(full: bool = True, at_exit: bool = False) -> str:
    """The report of the blocks live now as text; with full=False only its
    SUMMARY line. Mid-run it says "still live now"; at_exit=True words it as
    the report at exit ("still live at exit", "leaked")."""
    return collect_text("tally_write_leaks", (1 if full else 0) | (2 if at_exit else 0))


def snapshot_from_report(doc: Dict[str, Any]) -> Dict[str, Any]:
    """A dict shaped as ``torch.cuda.memory._snapshot()`` for a report
    (``segments``, and ``device_traces`` when it was written with
    ``timeline:true``); the conversion lives in :mod:`tally.viz`."""
    from . import viz

    return viz.to_snapshot(doc)


def snapshot() -> Dict[str, Any]:
    """This process's memory as ``torch.cuda.memory._snapshot()`` would give
    it (configure ``timeline:true`` for the traces)."""
    return snapshot_from_report(report())


def dump_snapshot(path: str, doc: Optional[Dict[str, Any]] = None) -> None:
    """Pickle the snapshot (of this process, or of the report ``doc``) to
    ``path``, as ``torch.cuda.memory._dump_snapshot`` does; open it with
    ``python -m torch.cuda._memory_viz trace_plot PATH -o out.html`` or at
    pytorch.org/memory_viz."""
    from . import viz

    viz.write_snapshot(snapshot() if doc is None else snapshot_from_report(doc), path)
