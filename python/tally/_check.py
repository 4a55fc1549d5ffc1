"""Strict checks of what the Python side reads from a tally JSON report, the
same rules as the tally command's reader (lib/report/stats_json.c,
tools/cli_report.h; docs/bad-input.md): a stats key that is not tally's, a
missing key, or counts that do not add up are named, never read as 0. A
report of a newer tally is refused naming both versions; older ones are
read (fields added since are optional)."""

from __future__ import annotations

from typing import Any, Dict, List

POOL_STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
POOLS = ("all", "small_pool", "large_pool")
FIELDS = ("current", "peak", "allocated", "freed")
SCALARS = ("num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc",
           "num_device_free")


def stat_keys() -> List[str]:
    """Every key of tally's stats (torch.cuda.memory_stats() form), sorted."""
    keys = [f"{s}.{p}.{f}" for s in POOL_STATS for p in POOLS for f in FIELDS]
    keys += [f"{s}.{f}" for s in ("oversize_allocations", "oversize_segments") for f in FIELDS]
    return sorted(keys + list(SCALARS))


KEYS = stat_keys()


class DamageError(ValueError):
    """A report field that is missing, unknown or inconsistent."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_stats(stats: Any, where: str) -> None:
    """A report's own stats: every key known and present, an integer, and
    the counts adding up; DamageError naming the key otherwise."""
    if not isinstance(stats, dict):
        raise DamageError(f"{where}: should be an object, not {type(stats).__name__}")
    for key in stats:
        if key not in KEYS:
            near = [k for k in KEYS if _distance(key, k) <= 2]
            hint = f" (did you mean \"{near[0]}\"?)" if near else ""
            raise DamageError(f"{where}: unknown key \"{key}\"{hint}")
    for key in KEYS:
        if key not in stats:
            raise DamageError(f"{where}: key \"{key}\" is missing")
        if not _is_int(stats[key]):
            raise DamageError(f"{where}: \"{key}\" should be an integer, not {type(stats[key]).__name__}")
        if stats[key] < 0 and key != "max_split_size":
            raise DamageError(f"{where}: \"{key}\" is {stats[key]}, below 0")
    for key in KEYS:
        if key.endswith(".current") and stats[key] > stats[key[:-8] + ".peak"]:
            peak = key[:-8] + ".peak"
            raise DamageError(f"{where}: \"{key}\" is {stats[key]}, above \"{peak}\" ({stats[peak]})")
    for s in POOL_STATS:
        for f in FIELDS:
            a, b, c = (stats[f"{s}.{p}.{f}"] for p in POOLS)
            if f != "peak" and a != b + c:
                raise DamageError(f"{where}: \"{s}.all.{f}\" is {a}, but small_pool + large_pool is {b + c}")
            if f == "peak" and not max(b, c) <= a <= b + c:
                raise DamageError(f"{where}: \"{s}.all.peak\" is {a}, not between the larger pool peak "
                                  f"({max(b, c)}) and their sum ({b + c})")


def _distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap neighbours) from a to b."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def _version(v: str):
    parts = v.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def check_report(report: Dict[str, Any], mine: str) -> None:
    """The fields of a tally report the Python side reads, checked as the
    tally command checks them; mine is this tally's version."""
    version = report.get("version")
    if version is not None:
        v = _version(version) if isinstance(version, str) else None
        if v is None:
            raise DamageError(f"\"version\" {version!r} is not a tally version")
        if v[:2] > _version(mine)[:2]:
            raise DamageError(f"written by tally {version}, newer than this tally ({mine}): read it with tally "
                              f"{v[0]}.{v[1]} or later")
    for i, dev in enumerate(report.get("devices") or []):
        if not isinstance(dev, dict):
            raise DamageError(f"devices[{i}]: should be an object")
        if "stats" not in dev:
            raise DamageError(f"devices[{i}]: missing \"stats\"")
        check_stats(dev["stats"], f"devices[{i}].stats")
    for i, row in enumerate(report.get("ledger") or []):
        where = f"ledger[{i}]"
        for key in ("current_bytes", "peak_bytes", "live_blocks"):
            if not _is_int(row.get(key)):
                raise DamageError(f"{where}: \"{key}\" should be an integer")
        if row["current_bytes"] < 0 or row["live_blocks"] < 0:
            raise DamageError(f"{where}: a count is below 0")
        if row["current_bytes"] > row["peak_bytes"]:
            raise DamageError(f"{where}: current_bytes {row['current_bytes']} is above peak_bytes {row['peak_bytes']}")
        if _is_int(row.get("allocated_bytes")) and _is_int(row.get("freed_bytes")) and \
                row["current_bytes"] != row["allocated_bytes"] - row["freed_bytes"]:
            raise DamageError(f"{where}: current_bytes {row['current_bytes']} is not allocated_bytes - freed_bytes "
                              f"({row['allocated_bytes'] - row['freed_bytes']})")
