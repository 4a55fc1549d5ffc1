"""torch.cuda's memory functions, answered by tally.

Same names, arguments and results as in ``torch.cuda`` (see
``tally.patch_torch()`` to make torch.cuda itself answer from tally), which
PyTorch cannot give for a pluggable allocator ("CUDAPluggableAllocator does
not yet support ..."). All work without PyTorch installed.
"""

from __future__ import annotations

import collections
import ctypes
import json
import sys
from typing import Any, Dict, List, Optional, Tuple, Union

from ._lib import call, collect_text, has, library, pool_stat
from ._reports import report, snapshot_from_report

# The torch.cuda names this module answers (patch_torch() replaces exactly these).
TORCH_NAMES = (
    "memory_stats",
    "memory_summary",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "memory_snapshot",
    "memory_stats_as_nested_dict",
    "mem_get_info",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
)

# torch.accelerator's memory functions (PyTorch 2.6 and later, where present)
# and the function of this module that answers each.
ACCELERATOR_NAMES = {
    "memory_stats": "memory_stats",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "empty_cache": "empty_cache",
    "get_memory_info": "mem_get_info",
}

__all__ = list(TORCH_NAMES) + ["device_index"]

Device = Union[None, int, str, Any]


def device_index(device: Device = None) -> int:
    """The device number of ``device`` as torch.cuda understands it: None is
    the current device (PyTorch's when CUDA is initialised, else 0), an int,
    "cuda" / "cuda:N", or a torch.device."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
        return 0
    if isinstance(device, bool):
        raise TypeError("tally: a device is an int, a str or a torch.device, not a bool")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, number = device.partition(":")
        if kind != "cuda":
            raise ValueError(f"tally: expected a CUDA device, got {device!r}")
        return int(number) if number else device_index(None)
    kind = getattr(device, "type", None)
    if kind is not None:
        if kind != "cuda":
            raise ValueError(f"tally: expected a CUDA device, got {device!r}")
        index = getattr(device, "index", None)
        return device_index(None) if index is None else int(index)
    raise TypeError(f"tally: cannot read a device from {device!r}")


def _started() -> bool:
    """Whether tally's backend has started. Like torch.cuda's functions
    before CUDA is initialised, the queries below answer without starting it
    (empty statistics, zeros), so that logging memory early in a program does
    not start CUDA."""
    return not has("tally_backend_started") or bool(library().tally_backend_started())


def memory_stats(device: Device = None) -> "collections.OrderedDict[str, int]":
    """torch.cuda.memory_stats: a flat, key-sorted dict such as
    ``{"allocated_bytes.all.current": ..., "num_ooms": ...}``; empty before
    tally has started (as torch's before CUDA is initialised)."""
    if not _started():
        return collections.OrderedDict()
    text = collect_text("tally_write_stats_json", device_index(device))
    return collections.OrderedDict(sorted(json.loads(text).items()))


def memory_stats_as_nested_dict(device: Device = None) -> Dict[str, Any]:
    """torch.cuda.memory_stats_as_nested_dict: memory_stats with each dotted
    key split into nested dicts ({"allocated_bytes": {"all": {"current": ...}}})."""
    nested: Dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        node = nested
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def mem_get_info(device: Device = None) -> Tuple[int, int]:
    """torch.cuda.mem_get_info: (free bytes, total bytes) of the device as
    the backend reports them."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    call("tally_mem_get_info", device_index(device), ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def set_per_process_memory_fraction(fraction: float, device: Device = None) -> None:
    """torch.cuda.set_per_process_memory_fraction: cap the device's reserved
    memory at fraction (0 to 1) of its capacity."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    call("tally_set_memory_fraction", fraction, device_index(device))


def get_per_process_memory_fraction(device: Device = None) -> float:
    """torch.cuda.get_per_process_memory_fraction: the device's cap as a
    fraction of its capacity (1.0 when uncapped)."""
    fraction = ctypes.c_double()
    call("tally_get_memory_fraction", device_index(device), ctypes.byref(fraction))
    return fraction.value


def memory_summary(device: Device = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary: the same table, byte for byte."""
    return collect_text("tally_write_summary", device_index(device), 1 if abbreviated else 0)


def memory_allocated(device: Device = None) -> int:
    """Bytes currently handed out on the device (torch.cuda.memory_allocated)."""
    return pool_stat(device_index(device), "allocated_bytes", "current") if _started() else 0


def max_memory_allocated(device: Device = None) -> int:
    """Peak of memory_allocated since start or the last peak reset."""
    return pool_stat(device_index(device), "allocated_bytes", "peak") if _started() else 0


def memory_reserved(device: Device = None) -> int:
    """Bytes currently obtained from the device by the cache."""
    return pool_stat(device_index(device), "reserved_bytes", "current") if _started() else 0


def max_memory_reserved(device: Device = None) -> int:
    """Peak of memory_reserved since start or the last peak reset."""
    return pool_stat(device_index(device), "reserved_bytes", "peak") if _started() else 0


def reset_peak_memory_stats(device: Device = None) -> None:
    """Set every peak statistic to its current value."""
    if _started():
        call("tally_reset_peak_stats", device_index(device))


def reset_accumulated_memory_stats(device: Device = None) -> None:
    """Zero the allocated / freed counts and the num_* counters."""
    if _started():
        call("tally_reset_accumulated_stats", device_index(device))


def empty_cache() -> None:
    """Release every unused cached segment of every device to the backend."""
    if _started():
        library().tally_empty_cache(-1)


def memory_snapshot(mempool_id: Optional[Any] = None) -> List[Dict[str, Any]]:
    """torch.cuda.memory_snapshot: every segment of every device with its
    blocks (address, size, requested_size, state). ``mempool_id`` is accepted
    for signature compatibility and ignored: tally has one pool per device."""
    return snapshot_from_report(report())["segments"]
