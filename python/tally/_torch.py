"""Plugging tally into PyTorch.

``install()`` makes tally PyTorch's CUDA allocator through
``torch.cuda.memory.CUDAPluggableAllocator`` and wires the optional hooks,
so that ``torch.cuda.empty_cache()``, ``set_per_process_memory_fraction()``,
``Tensor.record_stream()`` and base-allocation queries reach tally, and makes
an out-of-memory raise ``c10::OutOfMemoryError`` where it can (_oom_shim).
It does not start tally's backend, so nothing touches CUDA until PyTorch
initialises it (the init hook) or the first allocation: the program may still
set ``CUDA_VISIBLE_DEVICES`` after ``install()``. ``patch_torch()`` makes the
statistics functions of ``torch.cuda`` answer from tally, since PyTorch
cannot answer them for a pluggable allocator.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any, Dict, Optional, Tuple

from . import _oom_shim, _stats
from ._lib import TallyError, library, library_path
from ._options import configure

__all__ = ["install", "installed", "patch_torch", "unpatch_torch", "PATCHED_NAMES"]

# The optional hooks of torch._C._CUDAPluggableAllocator: setter -> C function.
_HOOKS = (
    ("set_init_fn", "tally_torch_init"),
    ("set_reset_fn", "tally_torch_empty_cache"),
    ("set_memory_fraction_fn", "tally_torch_memory_fraction"),
    ("set_record_stream_fn", "tally_torch_record_stream"),
    ("set_base_alloc_fn", "tally_torch_base_alloc"),
    # CUDA graph pools (C++ signatures, lib/torch/torch_graph.cc); without them tally
    # refuses allocations on a capturing stream rather than share its memory.
    ("set_begin_allocate_to_pool", "tally_torch_begin_allocate_to_pool"),
    ("set_end_allocate_to_pool_fn", "tally_torch_end_allocate_to_pool"),
    ("set_release_pool", "tally_torch_release_pool"),
)

# torch.cuda functions that patch_torch() replaces with tally's.
PATCHED_NAMES = _stats.TORCH_NAMES

_allocator: Optional[Any] = None
# (module, name) -> PyTorch's function, keyed by id(module).
_originals: Dict[Tuple[int, str], Tuple[Any, Any]] = {}


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise TallyError("tally: PyTorch is not installed (tally's C API and reports still work without it)") from e
    return torch


def _address(name: str) -> int:
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value


def installed() -> bool:
    """Whether install() has made tally PyTorch's CUDA allocator."""
    return _allocator is not None


def install(conf: Optional[Any] = None):
    """Make tally PyTorch's CUDA allocator; call it before any CUDA use.

    ``conf`` (a ``"key:value,key:value"`` string or a dict) is applied with
    tally_configure before tally starts, on top of ``TALLY_CONF``. Returns the
    ``CUDAPluggableAllocator``. Calling it again returns the same allocator
    (a ``conf`` is still applied, so only runtime keys are accepted then).

    Raises RuntimeError when CUDA is already initialised in this process
    (PyTorch cannot swap its allocator then), TallyError when PyTorch or its
    CUDA support is missing, or the configuration is bad.
    """
    global _allocator
    if _allocator is not None:
        if conf is not None:
            configure(conf)
        return _allocator
    # PyTorch first: the CUDA runtime it loads is then the one libtally.so
    # binds to (same soname), rather than the other way round.
    torch = _import_torch()
    if conf is not None:
        configure(conf)
    if getattr(torch.version, "cuda", None) is None or not hasattr(torch._C, "_cuda_customAllocator"):
        raise TallyError("tally.install(): this PyTorch build has no CUDA support")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "tally.install() must be called before any CUDA use: CUDA is already initialised in this "
            "process, and PyTorch cannot swap its allocator then. Call tally.install() at the very start "
            "(before creating CUDA tensors or calling torch.cuda functions), or run the program with "
            "`python -m tally run script.py`."
        )
    # Nothing here may start tally's backend or CUDA (no tally_init, no
    # device queries): that waits for PyTorch's lazy CUDA init.
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "tally_torch_alloc", "tally_torch_free")
    handle = pluggable.allocator()
    missing = []
    for setter, name in _HOOKS:
        fn = getattr(handle, setter, None)
        if fn is None:
            missing.append(setter)
        else:
            fn(_address(name))
    try:
        torch.cuda.memory.change_current_allocator(pluggable)
    except RuntimeError as e:
        raise RuntimeError(f"tally.install() must be called before any CUDA use: {e}") from e
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None:
        lazy_call(_refuse_host_memory_for_cuda)
    if missing:
        warnings.warn(f"tally: this PyTorch lacks {', '.join(missing)}; those hooks do not reach tally", stacklevel=2)
    if not any(setter in missing for setter, name in _HOOKS if "pool" in name):
        # PyTorch announces every capture through the graph-pool hooks: the
        # cached path need not ask the driver about captures.
        library().tally_graph_captures_announced()
    _oom_shim.install(torch)
    if not library().tally_torch_oom_raises():
        warnings.warn(
            "tally: this libtally.so was built without lib/torch/torch_oom.cc, so an out-of-memory cannot be "
            "raised as a Python error; PyTorch would receive a NULL pointer",
            stacklevel=2,
        )
    _allocator = pluggable
    return pluggable


def _refuse_host_memory_for_cuda() -> None:
    """Queued with torch.cuda._lazy_call by install(): runs inside PyTorch's
    lazy CUDA init, after the init hook started tally, so neither CUDA nor
    tally is started earlier for this check."""
    torch = _import_torch()
    if library().tally_backend_name().decode() == "host" and torch.cuda.device_count() > 0:
        raise TallyError(
            "tally: tally runs its host backend (simulated devices in host memory) but PyTorch sees a CUDA "
            "device, so CUDA tensors would get host memory; drop backend:host, or set backend:cuda to see why "
            "the cuda backend cannot start"
        )


def _patch(module: Any, name: str, ours: Any) -> None:
    if module is not None and hasattr(module, name):
        _originals.setdefault((id(module), name), (module, getattr(module, name)))
        setattr(module, name, ours)


def patch_torch() -> None:
    """Make torch.cuda's memory functions (PATCHED_NAMES: memory_stats,
    memory_stats_as_nested_dict, memory_summary, memory_allocated,
    max_memory_allocated, memory_reserved, max_memory_reserved,
    reset_peak_memory_stats, reset_accumulated_memory_stats, empty_cache,
    memory_snapshot, mem_get_info, set_per_process_memory_fraction,
    get_per_process_memory_fraction) answer from tally, in torch.cuda and
    torch.cuda.memory; and torch.accelerator's memory functions too, where
    the installed PyTorch has them (ACCELERATOR_NAMES). Names PyTorch lacks
    are not added. unpatch_torch() restores PyTorch's."""
    torch = _import_torch()
    for name in PATCHED_NAMES:
        for module in (torch.cuda, torch.cuda.memory):
            _patch(module, name, getattr(_stats, name))
    accelerator = getattr(torch, "accelerator", None)
    for name, ours in _stats.ACCELERATOR_NAMES.items():
        for module in (accelerator, getattr(accelerator, "memory", None)):
            _patch(module, name, getattr(_stats, ours))


def unpatch_torch() -> None:
    """Undo patch_torch()."""
    for (_, name), (module, original) in _originals.items():
        setattr(module, name, original)
    _originals.clear()
