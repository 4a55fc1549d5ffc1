"""Sleep and wake by tag: give a private tag's GPU memory back and bring it
back at the same addresses (docs/sleep.md)::

    with tally.tag("weights", private=True):
        model = build()
    tally.sleep("weights", offload=True)   # contents to host memory, pages unmapped
    ...                                    # another job uses the GPU
    tally.wake("weights")                  # same addresses, same bytes

    with tally.asleep("kv_cache"):         # discarded while inside, woken after
        train_step()

A tag must be private before it allocates (``tally.tag(name, private=True)``
or the ``private_tags`` key). While a tag sleeps its tensors keep their
addresses but must not be used; freeing them is fine.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Dict, Iterator, Sequence

from ._lib import call, encode, library

__all__ = ["asleep", "sleep", "sleep_info", "wake"]

_OFFLOAD = 1
_SYNC_DEVICE = 2


def _names(tags: Sequence[str], fn: str):
    if not tags:
        raise TypeError(f"tally.{fn}: give at least one tag")
    encoded = [encode(t) for t in tags]
    return (ctypes.c_char_p * len(encoded))(*encoded), len(encoded)


def sleep(*tags: str, offload: bool = False, sync_device: bool = False) -> None:
    """Put the private tags to sleep (tally_sleep): wait for the work tally
    knows uses their blocks (their allocation streams and the streams given
    to record_stream; with ``sync_device=True`` the whole device), with
    ``offload=True`` copy their live blocks to pinned host memory, then unmap
    their pages and keep the addresses. Without offload the contents are
    lost. Raises TallyError (nothing changed) for a tag that is not private,
    has blocks in a CUDA graph's pool or from before it became private, or
    when a capture is under way."""
    arr, n = _names(tags, "sleep")
    call("tally_sleep", arr, n, (_OFFLOAD if offload else 0) | (_SYNC_DEVICE if sync_device else 0))


def wake(*tags: str) -> None:
    """Wake the tags (tally_wake): map their pages back at the same addresses
    and restore what was offloaded, byte for byte. Out of memory raises
    TallyError saying how much was missing; the tag then stays asleep with
    its backup."""
    arr, n = _names(tags, "wake")
    call("tally_wake", arr, n)


@contextlib.contextmanager
def asleep(*tags: str, offload: bool = False, sync_device: bool = False) -> Iterator[None]:
    """Sleep the tags on entry and wake them on exit (also when the block
    raises)."""
    sleep(*tags, offload=offload, sync_device=sync_device)
    try:
        yield
    finally:
        wake(*tags)


class _Info(ctypes.Structure):
    _fields_ = [("is_private", ctypes.c_int), ("asleep", ctypes.c_int), ("offloaded", ctypes.c_int),
                ("reserved", ctypes.c_uint64), ("sleeping", ctypes.c_uint64), ("sleeping_blocks", ctypes.c_uint64),
                ("unmapped", ctypes.c_uint64), ("offload", ctypes.c_uint64), ("sleeps", ctypes.c_uint64),
                ("wakes", ctypes.c_uint64), ("kept", ctypes.c_uint64)]


def sleep_info(tag: str, device: int = -1) -> Dict[str, Any]:
    """What the tag holds and did (tally_tag_sleep_info) on ``device`` (-1:
    every device, summed): private, asleep, offloaded, mapped_bytes,
    sleeping_bytes (owned, not resident), sleeping_blocks, unmapped_bytes,
    offload_bytes (host memory), kept_pinned_bytes (pinned host memory kept
    from a wake for the next offload), sleeps, wakes."""
    info = _Info()
    library()  # loaded, so the prototypes are set
    call("tally_tag_sleep_info", encode(tag), device, ctypes.byref(info))
    return {"private": bool(info.is_private), "asleep": bool(info.asleep), "offloaded": bool(info.offloaded),
            "mapped_bytes": info.reserved, "sleeping_bytes": info.sleeping, "sleeping_blocks": info.sleeping_blocks,
            "unmapped_bytes": info.unmapped, "offload_bytes": info.offload, "kept_pinned_bytes": info.kept,
            "sleeps": info.sleeps, "wakes": info.wakes}
