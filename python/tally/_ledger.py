"""Stages and tags: who owns the memory allocated inside a block of code.

Both are context managers that also work as decorators::

    with tally.stage("load"):
        model = build()

    @tally.tag("activations")
    def forward(x): ...

A **stage** is process-wide (any thread's allocations count towards the
innermost stage); when it ends, tally reports the blocks born in it that
are still live. A **tag** is per thread: it names what the calling thread
allocates while it is pushed. PyTorch runs the backward pass on its own
autograd threads, so memory allocated there is untagged unless those
threads push a tag themselves.

``tag()`` without a name names the tag after the code that opens it: the
``file.py:line`` of the ``with`` statement, or ``module.function`` when used
as a decorator. That gives a Python-level allocation site per tag without a
per-allocation Python callback.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Optional, TypeVar

from ._lib import TallyError, call, encode

__all__ = ["ignore", "stage", "tag"]

F = TypeVar("F", bound=Callable)


class stage(contextlib.ContextDecorator):
    """Begin stage ``name`` on entry and end it on exit (tally_stage_begin /
    tally_stage_end). Stages nest; each must end before its parent."""

    def __init__(self, name: str):
        self.name = name
        self._encoded = encode(name)

    def __enter__(self) -> "stage":
        call("tally_stage_begin", self._encoded)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _end(exc_type, "tally_stage_end", self._encoded)
        return False

    def __repr__(self) -> str:
        return f"tally.stage({self.name!r})"


def ignore(block) -> None:
    """Mark a live block as kept on purpose (tally_ignore): the leak report
    counts it apart as ignored and it never sets leak_exitcode. ``block`` is
    a tensor (its ``data_ptr()``, which must be the start of the block tally
    handed out) or an address."""
    ptr = block.data_ptr() if hasattr(block, "data_ptr") else int(block)
    call("tally_ignore", ptr)


def _end(exc_type, name: str, *args) -> None:
    """Close a stage or tag; while an exception is propagating, a failure to
    close (already reported on tally's diagnostics) must not replace it."""
    try:
        call(name, *args)
    except TallyError:
        if exc_type is None:
            raise


def _caller_site(depth: int) -> str:
    frame = sys._getframe(depth)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class tag(contextlib.ContextDecorator):
    """Push tag ``name`` on this thread's tag stack on entry and pop it on exit
    (tally_tag_push / tally_tag_pop). Without a name, the tag is named after
    the call site (see the module documentation)."""

    def __init__(self, name: Optional[str] = None, private: bool = False):
        self._auto = name is None
        self.name = _caller_site(2) if name is None else name
        self._encoded = encode(self.name)
        self.private = private

    def __call__(self, func: F) -> F:
        if self._auto:
            named = tag(f"{func.__module__}.{func.__qualname__}", private=self.private)
            return named(func)
        return super().__call__(func)

    def __enter__(self) -> "tag":
        if self.private:
            # Its blocks get pages of their own, so it can sleep and wake
            # (tally.sleep / tally.wake; docs/sleep.md).
            call("tally_tag_set_private", self._encoded)
        call("tally_tag_push", self._encoded)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _end(exc_type, "tally_tag_pop")
        return False

    def __repr__(self) -> str:
        extra = ", private=True" if self.private else ""
        return f"tally.tag({self.name!r}{extra})"

