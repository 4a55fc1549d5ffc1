/* The PyTorch pluggable-allocator entry points: plain C functions that
 * torch.cuda.memory.CUDAPluggableAllocator finds by name in libtally.so
 * (opened RTLD_NOW | RTLD_LOCAL and never closed), plus the optional hooks
 * its allocator object accepts (init, reset = empty_cache, memory fraction,
 * record_stream, base_alloc).
 *
 * Two things PyTorch does not do for us are handled here:
 *  - it never checks the pointer alloc returns, so a failed allocation is
 *    turned into a C++ exception (lib/torch/torch_oom.cc, reached through a weak
 *    symbol so the library also links without it) that PyTorch's bindings
 *    turn into a Python RuntimeError;
 *  - it passes back the size and device it remembered, which has been wrong
 *    in one release line and says nothing about the current device, so free
 *    uses the argument only as a hint, frees by tally's own record, and
 *    reports a disagreement once.
 *
 * Free takes the block out of the pointer map itself (rather than calling
 * tally_free_checked) so that the hot path looks up the block once, starting
 * at the device PyTorch names. Everything else goes through the public API. */
#include "api/api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* lib/torch/torch_oom.cc: throws a C++ exception carrying message. Absent (NULL)
 * when the library is built without it; then alloc returns NULL as a plain C
 * allocator would. oom is non-zero for out-of-memory. */
extern void tally__torch_raise(int oom, const char *message) __attribute__((weak, visibility("hidden")));

static _Atomic int warned_size, warned_device, warned_count;

/* Set by the Python package when it has built its shim against the
 * installed PyTorch (python/tally/_oom_shim.cc): throws c10::OutOfMemoryError.
 * Takes precedence over torch_oom.cc's std::runtime_error. */
static _Atomic(tally_torch_raise_fn) raiser;

void tally_torch_set_oom_raiser(tally_torch_raise_fn raise)
{
    atomic_store(&raiser, raise);
}

int tally_torch_oom_raises(void)
{
    return atomic_load(&raiser) != NULL || tally__torch_raise != NULL;
}

static void size_text(size_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%zu bytes", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
}

/* Alloc failed: raise (when torch_oom.cc is linked in) with a message that
 * reads like PyTorch's own OOM ("CUDA out of memory. Tried to allocate ..."),
 * so code that matches that text (batch-size finders) still works. */
static void alloc_failed(size_t size, int device)
{
    const char *why = tally_last_error();
    bool oom = strncmp(why, "out of memory", 13) == 0 || strncmp(why, "out of host memory", 18) == 0;
    char asked[40], msg[900];
    size_text(size, asked, sizeof asked);
    if (oom)
        snprintf(msg, sizeof msg,
                 "CUDA out of memory. Tried to allocate %s on device %d. tally: %s "
                 "(the holders by tag and stage were written to tally's diagnostics)",
                 asked, device, why);
    else
        snprintf(msg, sizeof msg, "tally: cannot allocate %s on device %d: %s", asked, device, why);
    tally_torch_raise_fn raise = atomic_load(&raiser);
    if (raise)
        raise(oom, msg);
    else if (tally__torch_raise)
        tally__torch_raise(oom, msg);
}

/* The allocations tally_malloc's fast half does not take (api.h): its slow
 * half, inline here (the allocation site is captured in this frame). */
__attribute__((noinline)) static void *torch_alloc_slow(size_t size, int device, void *stream)
{
    if (size == 0)
        return NULL;
    void *p = tally__malloc_slow_inline(size, device, stream);
    if (!p)
        alloc_failed(size, device);
    return p;
}

/* The fast half's miss: the slow path with nothing done, or the cache's
 * failure raised. */
__attribute__((noinline)) static void *torch_alloc_miss(size_t size, int device, void *stream, bool failed)
{
    if (!failed)
        return torch_alloc_slow(size, device, stream);
    alloc_failed(size, device);
    return NULL;
}

void *tally_torch_alloc(size_t size, int device, void *stream)
{
    if (TALLY_LIKELY(tally__malloc_fast_ok(size, device)))
        return tally__cache_malloc_biased(tally__g.dev[device], size, device, stream, torch_alloc_miss);
    return torch_alloc_slow(size, device, stream);
}

/* Free a block taken out of d's map, then say once if PyTorch's size or
 * device disagree with tally's record (after the unlock: the sink may be
 * slow). */
static void free_taken(tally_device_t *d, tally_block_t *b, void *ptr, size_t size, int device)
{
    size_t requested = b->requested;
    int owner = d->id;
    tally__cache_free_locked(d, b);
    tally__dev_unlock(&d->lock);
    if (TALLY_UNLIKELY(size != requested) && !atomic_exchange(&warned_size, 1))
        tally__diag("tally_torch_free: PyTorch passed %zu bytes for %p, which was allocated with %zu; freed by "
                    "tally's record (further size mismatches are not reported)",
                    size, ptr, requested);
    if (TALLY_UNLIKELY(device != owner) && !atomic_exchange(&warned_device, 1))
        tally__diag("tally_torch_free: PyTorch passed device %d for %p, which belongs to device %d; freed by "
                    "tally's record (further device mismatches are not reported)",
                    device, ptr, owner);
}

/* Every free the fast path below does not take. */
__attribute__((noinline)) static void torch_free_slow(void *ptr, size_t size, int device)
{
    if (!ptr || tally__ensure_init())
        return;
    tally_device_t *d;
    tally_block_t *b = tally__find_live_from(device, (uintptr_t)ptr, true, &d);
    if (!b) {
        /* Unknown pointer or double free: tally_free names which, and owner. */
        tally_free(ptr);
        return;
    }
    free_taken(d, b, ptr, size, device);
}

/* The fast path: initialised, a device tally has; the rest (the lock by
 * bias, the block at ptr with the size PyTorch names) is the cache's fast
 * half, whose miss is the slow path with nothing done. */
void tally_torch_free(void *ptr, size_t size, int device, void *stream)
{
    (void)stream;
    if (TALLY_LIKELY(atomic_load_explicit(&tally__initialised, memory_order_acquire) == 1) &&
        TALLY_LIKELY((unsigned)device < (unsigned)tally__g.ndev)) {
        tally__cache_free_biased(tally__g.dev[device], ptr, size, device, torch_free_slow);
        return;
    }
    torch_free_slow(ptr, size, device);
}

void tally_torch_init(int device_count)
{
    if (tally_init())
        return; /* already reported on the sink */
    int ours = tally_device_count();
    if (ours != device_count && tally__g.backend != &tally__backend_host && !atomic_exchange(&warned_count, 1))
        tally__diag("tally_torch_init: PyTorch sees %d CUDA device%s, tally's %s backend %d", device_count,
                    device_count == 1 ? "" : "s", tally__g.backend->name, ours);
}

void tally_torch_empty_cache(void)
{
    tally_empty_cache(-1);
}

void tally_torch_memory_fraction(double fraction, int device)
{
    tally_set_memory_fraction(fraction, device); /* a bad value is reported on the sink */
}

void tally_torch_record_stream(void *ptr, void *stream)
{
    if (ptr)
        tally_record_stream(ptr, stream);
}

void *tally_torch_base_alloc(void *ptr, size_t *size)
{
    if (!ptr || !size) {
        tally__fail(TALLY_EINVAL, "tally_torch_base_alloc: %s is NULL", ptr ? "size" : "ptr");
        if (size)
            *size = 0;
        return NULL;
    }
    *size = 0;
    if (tally__ensure_init())
        return NULL;
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        tally_segment_t *s = tally__cache_segment_of_locked(d, (uintptr_t)ptr);
        /* PyTorch asks for the base to pass it to cudaIpcGetMemHandle, which
         * takes memory made by cudaMalloc (cuMemAlloc) only: not pages of
         * CUDA's virtual memory API (expandable segments, their small pool's
         * run or a segment lent from them, a private tag's segments: so no
         * other process maps a tag that may sleep), nor a stream-ordered
         * pool's memory (backend:async), which needs an IPC-capable pool and
         * cuMemPoolExportPointer. Refused here with the reason, not there
         * with a bare CUDA error. */
        bool vmm = s && (s->ex || s->run_va || s->lender || s->vm), pool = s && tally__g.backend->passthrough;
        uintptr_t base = s ? s->base : 0;
        size_t bytes = s ? s->size : 0;
        tally__dev_unlock(&d->lock);
        if (vmm || pool) {
            tally__fail(TALLY_EINVAL,
                        "tally_torch_base_alloc: %p is %s, which CUDA IPC (cudaIpcGetMemHandle) cannot share: it takes "
                        "cudaMalloc memory only; share tensors between processes with %s",
                        ptr, vmm ? "on pages of CUDA's virtual memory API (expandable segments or a private tag)"
                                 : "memory of CUDA's stream-ordered pool (backend:async)",
                        vmm ? "expandable_segments:false and a tag that is not private" : "backend:cuda");
            return NULL;
        }
        if (s) {
            *size = bytes;
            return (void *)base;
        }
    }
    tally__fail(TALLY_EINVAL, "tally_torch_base_alloc: %p is not inside any segment of tally", ptr);
    return NULL;
}
