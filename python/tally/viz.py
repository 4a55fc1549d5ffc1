"""Export a tally JSON report as a PyTorch memory snapshot.

    python3 -m tally.viz report.json -o snapshot.pickle

The output is the dict torch.cuda.memory._snapshot() returns, pickled the way
torch.cuda.memory._dump_snapshot() pickles it, so PyTorch's tools read it:
drag it onto https://pytorch.org/memory_viz, or run
``python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o out.html``
(also ``segment_plot``, ``stats``, ``trace``, ``segments``, ``memory``).

What comes from where (docs/reports.md, "Snapshot export"):

- ``segments`` from the report's "segments": one dict per cached segment with
  device, address, total_size, allocated_size, active_size, requested_size,
  stream, segment_type ("small" / "large"), segment_pool_id, is_expandable,
  frames, and its blocks in address order, each with address, size,
  requested_size, state ("active_allocated", "active_pending_free",
  "inactive") and frames.
- ``device_traces`` from the report's "timeline" (recorded with
  TALLY_CONF=timeline:true): one list per device of {action, addr, size,
  stream, time_us, frames}. tally records "free_requested" when a block is
  freed; the block becomes reusable at once unless it waits on other streams'
  work, and tally does not record that moment, so each free_requested is
  followed by a "free_completed" at the same time, except for blocks still
  waiting (active_pending_free) when the report was written. "oom" entries
  carry device_free (0: tally does not record it) in place of addr.
  Stage begin / end events have no PyTorch action; they go to
  snapshot["tally"]["stages"] instead.
- ``frames``: each allocated block and each alloc / free entry gets its
  allocation site's frames from the report's "sites" (recorded with
  python_stack and backtrace_depth: Python frames first, innermost first,
  then native frames), each {"filename", "line", "name"} as PyTorch writes
  them, then one frame naming its owner,
  {"filename": "tally", "line": 0, "name": "tag weights, stage load"}. Without
  recorded sites the owner frame is the whole stack.
- ``allocator_settings``: the few PyTorch settings a report implies.
- ``tally``: what the report says about the process (rank, pid, home device,
  backend, tally version) and its stage boundaries.

Only the standard library is used; torch is not needed to write the file.
"""

import argparse
import errno
import json
import os
import pickle
import secrets
import sys

__all__ = ["load_report", "to_snapshot", "write_snapshot", "main"]

# PyTorch's web viewer (MemoryViz.js) unpickles protocols 2 to 4 only.
PICKLE_PROTOCOL = 4

_BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


class ReportError(ValueError):
    """The input is not a usable tally report."""


def load_report(path):
    """Read and check a tally JSON report; raise ReportError naming the problem."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ReportError(f"{path}: cannot open: {e.strerror}") from None
    try:
        report = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: malformed JSON: {e}") from None
    if not isinstance(report, dict) or report.get("format") != "tally-report":
        raise ReportError(f"{path}: not a tally report (write one with TALLY_CONF=report_path:FILE)")
    for key in ("devices", "segments"):
        if not isinstance(report.get(key), list):
            raise ReportError(f"{path}: not a valid tally report: \"{key}\" should be a list")
    from . import __version__
    from ._check import DamageError, check_report

    try:
        check_report(report, __version__)
    except DamageError as e:
        raise ReportError(f"{path}: not a valid tally report: {e}") from None
    if not isinstance(report.get("timeline", []), list):
        raise ReportError(f"{path}: not a valid tally report: \"timeline\" should be a list")
    return report


def _site_frames(report):
    """site id -> PyTorch frames, from the report's "sites"."""
    sites = {}
    for i, s in enumerate(report.get("sites", [])):
        try:
            sites[int(s["id"])] = [{"filename": f["filename"], "line": int(f["line"]), "name": f["name"]}
                                   for f in s["frames"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"sites[{i}]: missing or bad field: {e}") from None
    return sites


def _owner_frames(tag, stage, site=None, sites=None):
    if tag is None:
        return []
    frames = list(sites.get(site, [])) if sites and site is not None else []
    return frames + [{"filename": "tally", "line": 0, "name": f"tag {tag}, stage {stage}"}]


def _segment(seg, where, sites):
    try:
        blocks = []
        allocated = active = requested = 0
        for b in seg["blocks"]:
            state = b["state"]
            if state not in _BLOCK_STATES:
                raise ReportError(f"{where}: unknown block state {state!r}")
            size, req = int(b["size"]), int(b["requested_size"])
            if state == "active_allocated":
                allocated += size
            if state != "inactive":
                active += size
                requested += req
            block = {
                "address": int(b["address"]),
                "size": size,
                "requested_size": req,
                "state": state,
                "frames": (_owner_frames(b.get("tag"), b.get("stage"), b.get("site_id"), sites)
                           if state != "inactive" else []),
            }
            if state != "inactive":
                # Plain keys as well, for scripts (the visualiser ignores them).
                block["tag"] = b.get("tag", "untagged")
                block["stage"] = b.get("stage", "(none)")
            blocks.append(block)
        return {
            "device": int(seg["device"]),
            "address": int(seg["address"]),
            "total_size": int(seg["total_size"]),
            "allocated_size": allocated,
            "active_size": active,
            "requested_size": requested,
            "stream": int(seg["stream"]),
            "segment_type": seg["segment_type"],
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        }
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{where}: missing or bad field: {e}") from None


def _traces(report, ndev, pending, sites):
    """device_traces and the stage events, from the report's timeline."""
    traces = [[] for _ in range(ndev)]
    stages = []
    owner = {}  # (device, addr) -> (tag, stage, site id) of the live block there
    for i, e in enumerate(report.get("timeline", [])):
        try:
            dev, action = int(e["device"]), e["action"]
            entry = {
                "action": action,
                "addr": int(e.get("addr", 0)),
                "size": int(e.get("size", 0)),
                "stream": int(e.get("stream", 0)),
                "time_us": int(e["time_us"]),
                "frames": [],
            }
        except (KeyError, TypeError, ValueError) as err:
            raise ReportError(f"timeline[{i}]: missing or bad field: {err}") from None
        if dev < 0 or dev >= ndev:
            raise ReportError(f"timeline[{i}]: device {dev} is not in the report")
        key = (dev, entry["addr"])
        if action == "alloc":
            owner[key] = (e.get("tag"), e.get("stage"), e.get("site_id"))
            entry["frames"] = _owner_frames(*owner[key], sites)
            traces[dev].append(entry)
        elif action == "free_requested":
            # The block's owner comes from its allocation (older reports put
            # the freeing thread's tag on free events).
            entry["frames"] = _owner_frames(*owner.pop(key, (None, None, None)), sites)
            traces[dev].append(entry)
            traces[dev].append(dict(entry, action="free_completed"))
        elif action in ("segment_alloc", "segment_free"):
            traces[dev].append(entry)
        elif action == "oom":
            entry["device_free"] = 0
            del entry["addr"]
            traces[dev].append(entry)
        elif action in ("stage_begin", "stage_end"):
            stages.append({"device": dev, "action": action, "stage": e.get("stage"), "time_us": entry["time_us"]})
    # A block still waiting on other streams has not completed its last free.
    for dev, addr in pending:
        trace = traces[dev]
        for j in range(len(trace) - 1, -1, -1):
            t = trace[j]
            if t.get("addr") != addr or t["action"].startswith("segment"):
                continue
            if t["action"] == "free_completed":
                del trace[j]
            break
    return traces, stages


def to_snapshot(report):
    """The torch.cuda.memory._snapshot() dict for a loaded tally report."""
    devices = [int(d["device"]) for d in report["devices"]]
    ndev = max(devices) + 1 if devices else 0
    sites = _site_frames(report)
    segments = [_segment(s, f"segments[{i}]", sites) for i, s in enumerate(report["segments"])]
    for s in segments:
        if s["device"] >= ndev:
            ndev = s["device"] + 1
    segments.sort(key=lambda s: (s["device"], s["address"]))
    pending = {(s["device"], b["address"]) for s in segments for b in s["blocks"]
               if b["state"] == "active_pending_free"}
    traces, stages = _traces(report, ndev, pending, sites)
    max_split = -1
    for d in report["devices"]:
        max_split = d.get("stats", {}).get("max_split_size", max_split)
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": max_split,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
        },
        "tally": {
            "version": report.get("version"),
            "backend": report.get("backend"),
            "pid": report.get("pid"),
            "rank": report.get("rank"),
            "local_rank": report.get("local_rank"),
            "world_size": report.get("world_size"),
            "home_device": report.get("home_device"),
            "stages": stages,
        },
    }


def _create_beside(path):
    """A new file beside path, opened for writing: PATH.tmp- and 16 random hex
    digits, created exclusively and never through a symlink, so a name planted
    in a shared directory cannot redirect the write. Returns (fd, name)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(64):
        tmp = f"{path}.tmp-{secrets.token_hex(8)}"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", path)


def write_snapshot(snapshot, path):
    """Pickle snapshot to path (written to a temporary file beside it, then
    renamed over it, so a reader never sees half a file)."""
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f, protocol=PICKLE_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m tally.viz",
        description="Write a tally JSON report as a PyTorch memory snapshot (the pickle that "
                    "torch.cuda.memory._dump_snapshot writes), for https://pytorch.org/memory_viz "
                    "and python -m torch.cuda._memory_viz.")
    parser.add_argument("report", help="a tally JSON report (report_path; timeline:true for the traces)")
    parser.add_argument("-o", "--output", help="the pickle to write (default: REPORT with .pickle)")
    args = parser.parse_args(argv)
    out = args.output or os.path.splitext(args.report)[0] + ".pickle"
    try:
        snapshot = to_snapshot(load_report(args.report))
    except ReportError as e:
        print(f"tally.viz: {e}", file=sys.stderr)
        return 1
    try:
        write_snapshot(snapshot, out)
    except OSError as e:
        print(f"tally.viz: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 1
    nevents = sum(len(t) for t in snapshot["device_traces"])
    print(f"wrote {out}: {len(snapshot['segments'])} segments, {nevents} trace entries on "
          f"{len(snapshot['device_traces'])} devices")
    if not nevents:
        print("tally.viz: the report has no timeline; run with TALLY_CONF=timeline:true for the "
              "memory-over-time views", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
