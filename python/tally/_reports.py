"""tally's reports from Python: the JSON report (docs/reports.md) parsed into
dicts, the ledger and leak reports as rows or text, and an export of the
report in the format of PyTorch's memory snapshot, which PyTorch's memory
visualiser (``python -m torch.cuda._memory_viz``, pytorch.org/memory_viz)
reads."""

from __future__ import annotations

import json
import os
import pickle
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
    """Read a JSON report written by any tally process."""
    with open(path, "r", encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != "tally-report":
        raise ValueError(f"tally: {path} is not a tally report")
    return doc


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
    first: what the exit report would call leaks if the process ended now."""
    return report()["leaks"]


def ledger_text() -> str:
    """The ledger table and the stage history, as tally prints them."""
    return collect_text("tally_write_ledger")


def leaks_text(full: bool = True) -> str:
    """The leak report as text; with full=False only its SUMMARY line."""
    return collect_text("tally_write_leaks", 1 if full else 0)


def _frames(entry: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [
        {
            "filename": "<tally>",
            "line": 0,
            "name": f"tag {entry.get('tag', 'untagged')}, stage {entry.get('stage', '(none)')}",
        }
    ]


def _segments(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """torch.cuda.memory_snapshot()'s segment list from a report. Each block
    in use carries one synthetic frame naming its tag and stage, so the
    visualiser shows who owns it; both are also kept as plain keys."""
    segments = []
    for seg in doc.get("segments", []):
        blocks = []
        allocated = active = requested = 0
        for b in seg.get("blocks", []):
            block = {
                "address": b["address"],
                "size": b["size"],
                "requested_size": b.get("requested_size", 0),
                "state": b["state"],
                "frames": [],
            }
            if b["state"] != "inactive":
                active += b["size"]
                requested += block["requested_size"]
                if b["state"] == "active_allocated":
                    allocated += b["size"]
                block["tag"] = b.get("tag", "untagged")
                block["stage"] = b.get("stage", "(none)")
                block["frames"] = _frames(b)
            blocks.append(block)
        segments.append(
            {
                "device": seg["device"],
                "address": seg["address"],
                "total_size": seg["total_size"],
                "allocated_size": allocated,
                "active_size": active,
                "requested_size": requested,
                "stream": seg.get("stream", 0),
                "segment_type": seg.get("segment_type", "large"),
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    return segments


# tally timeline action -> PyTorch trace actions. A tally free returns the
# block at once (pending stream events aside), so it is both requested and
# completed. Stage markers have no counterpart and are left out.
_ACTIONS = {
    "alloc": ("alloc",),
    "free_requested": ("free_requested", "free_completed"),
    "segment_alloc": ("segment_alloc",),
    "segment_free": ("segment_free",),
    "oom": ("oom",),
}


def snapshot_from_report(doc: Dict[str, Any]) -> Dict[str, Any]:
    """A dict shaped as ``torch.cuda.memory._snapshot()``: ``segments`` and
    ``device_traces`` (one list per device; filled when the report was
    written with ``timeline:true``)."""
    ndev = max([d["device"] + 1 for d in doc.get("devices", [])] or [1])
    traces: List[List[Dict[str, Any]]] = [[] for _ in range(ndev)]
    for ev in doc.get("timeline", []):
        for action in _ACTIONS.get(ev.get("action"), ()):
            entry = {
                "action": action,
                "addr": ev.get("addr", 0),
                "size": ev.get("size", 0),
                "stream": ev.get("stream", 0),
                "time_us": ev.get("time_us", 0),
                "frames": _frames(ev),
            }
            if action == "oom":
                entry["device_free"] = 0
            device = ev.get("device", 0)
            if 0 <= device < ndev:
                traces[device].append(entry)
    return {"segments": _segments(doc), "device_traces": traces}


def snapshot() -> Dict[str, Any]:
    """This process's memory as ``torch.cuda.memory._snapshot()`` would give
    it (configure ``timeline:true`` for the traces)."""
    return snapshot_from_report(report())


def dump_snapshot(path: str, doc: Optional[Dict[str, Any]] = None) -> None:
    """Pickle the snapshot (of this process, or of the report ``doc``) to
    ``path``, as ``torch.cuda.memory._dump_snapshot`` does; open it with
    ``python -m torch.cuda._memory_viz trace_plot PATH -o out.html`` or at
    pytorch.org/memory_viz."""
    snap = snapshot() if doc is None else snapshot_from_report(doc)
    with open(path, "wb") as f:
        pickle.dump(snap, f)
