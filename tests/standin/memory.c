/* The CUDA stand-in: device memory (cuMemAlloc, cuMemFree, cuMemGetInfo) and
 * the address arenas every kind of device address comes from.
 *
 * Each device has its own MAP_NORESERVE mapping (readable and writable, so a
 * test may touch what it allocated; pages cost host memory only once
 * touched), so the device of an address is plain from its range. Addresses
 * are handed out first fit and reused once freed. Capacity is counted per
 * device: cuMemAlloc charges its size rounded up to 512 bytes (the
 * stand-in's unit; the real driver's granularity is coarser and not
 * documented), pools charge their reserved memory, cuMemCreate its size,
 * an active primary context a fixed amount (init.c). */
#include "standin.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int si_arena_init(struct si_arena *a, size_t span)
{
    void *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    a->base = p;
    a->span = span;
    a->live = NULL;
    a->count = a->cap = 0;
    return 0;
}

static size_t si_round_up(size_t v, size_t to)
{
    return (v + to - 1) / to * to;
}

uintptr_t si_arena_take(struct si_arena *a, size_t size, size_t align, enum si_extent_kind kind,
                        struct CUctx_st *ctx)
{
    if (size == 0 || size > a->span)
        return 0;
    if (a->count == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        struct si_extent *n = realloc(a->live, cap * sizeof *n);
        if (!n)
            return 0;
        a->live = n;
        a->cap = cap;
    }
    uintptr_t lo = (uintptr_t)a->base, end = lo + a->span;
    size_t i = 0;
    uintptr_t at = si_round_up(lo, align);
    for (; i < a->count; i++) {
        if (at + size <= a->live[i].addr)
            break;
        at = si_round_up(a->live[i].addr + a->live[i].size, align);
    }
    if (at + size > end)
        return 0;
    memmove(&a->live[i + 1], &a->live[i], (a->count - i) * sizeof a->live[0]);
    a->live[i] = (struct si_extent){.addr = at, .size = size, .kind = kind, .ctx = ctx};
    a->count++;
    return at;
}

struct si_extent *si_arena_find(struct si_arena *a, uintptr_t addr)
{
    size_t lo = 0, hi = a->count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->live[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < a->count && a->live[lo].addr == addr ? &a->live[lo] : NULL;
}

void si_arena_give(struct si_arena *a, struct si_extent *e)
{
    /* Drop the pages a test may have touched, keep the range mapped. */
    madvise((void *)e->addr, e->size, MADV_DONTNEED);
    si_arena_drop(a, e);
}

void si_arena_drop(struct si_arena *a, struct si_extent *e)
{
    size_t i = (size_t)(e - a->live);
    memmove(&a->live[i], &a->live[i + 1], (a->count - i - 1) * sizeof a->live[0]);
    a->count--;
}

/* cuMemAlloc: 'Allocates bytesize bytes of linear memory on the device ...
 * If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE'; the
 * device is the current context's (CUDA_ERROR_INVALID_CONTEXT without one,
 * in its documented results) and CUDA_ERROR_OUT_OF_MEMORY when it is full.
 * During a capture cuMemAlloc is 'potentially unsafe'
 * (cuThreadExchangeStreamCaptureMode: 'some actions, such as a call to
 * cudaMalloc, may be unsafe'): capture.c decides. */
CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    SI_ENTER();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc)
        rc = si_capture_unsafe_call();
    if (!rc && bytesize == 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc) {
        size_t size = si_round_up(bytesize, SI_ALIGN);
        if (size < bytesize || !si_charge(ctx->dev, size)) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            uintptr_t at = si_arena_take(&si_devices[ctx->dev].arena, size, SI_ALIGN, SI_EXTENT_ALLOC, ctx);
            if (!at) {
                si_uncharge(ctx->dev, size);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                *dptr = (CUdeviceptr)at;
            }
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* The device whose arena holds addr, or -1. */
static int si_device_of(uintptr_t addr)
{
    for (int d = 0; d < si_config.devices; d++) {
        const struct si_arena *a = &si_devices[d].arena;
        if (addr >= (uintptr_t)a->base && addr < (uintptr_t)a->base + a->span)
            return d;
    }
    return -1;
}

bool si_alloc_holds(uintptr_t addr, size_t size)
{
    int d = si_device_of(addr);
    if (d < 0)
        return false;
    const struct si_arena *a = &si_devices[d].arena;
    for (size_t i = 0; i < a->count; i++) {
        const struct si_extent *e = &a->live[i];
        if (e->kind == SI_EXTENT_ALLOC && addr >= e->addr && addr + size <= e->addr + e->size && addr + size > addr)
            return true;
    }
    return false;
}

/* cuMemFree: 'Frees the memory space pointed to by dptr, which must have
 * been returned by a previous call to' cuMemAlloc (among others); anything
 * else is CUDA_ERROR_INVALID_VALUE. A current context is needed
 * (CUDA_ERROR_INVALID_CONTEXT is among its results) but not the
 * allocation's: cuda.h, Unified Addressing: 'Unified addressing is
 * automatically enabled in 64-bit processes ... Since pointers are unique,
 * it is not necessary to specify information about the pointers' (a device
 * pointer names its device), so freeing device X's memory while device Y's
 * context is current is valid (../shared/cuda.md, "Contexts and devices"). During a capture a free is
 * 'potentially unsafe' like an allocation (it 'may perform implicit
 * synchronization', cuMemFree, which capture forbids). */
CUresult cuMemFree(CUdeviceptr dptr)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc)
        rc = si_capture_unsafe_call();
    if (!rc) {
        int d = si_device_of((uintptr_t)dptr);
        struct si_extent *e = d < 0 ? NULL : si_arena_find(&si_devices[d].arena, (uintptr_t)dptr);
        if (!e || e->kind != SI_EXTENT_ALLOC) {
            rc = CUDA_ERROR_INVALID_VALUE;
        } else {
            si_uncharge(d, e->size);
            si_arena_give(&si_devices[d].arena, e);
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* A reset context's cuMemAlloc allocations go with it (cuDevicePrimaryCtxRelease:
 * 'The context is automatically reset once the last reference to it is
 * released'). */
void si_memory_reset(struct CUctx_st *ctx)
{
    struct si_arena *a = &si_devices[ctx->dev].arena;
    for (size_t i = a->count; i-- > 0;) {
        if (a->live[i].kind == SI_EXTENT_ALLOC && a->live[i].ctx == ctx) {
            si_uncharge(ctx->dev, a->live[i].size);
            si_arena_give(a, &a->live[i]);
        }
    }
}

/* cuMemGetInfo: 'Returns in *total the total amount of memory available to
 * the the current context. Returns in *free the amount of memory on the
 * device that is free'; CUDA_ERROR_INVALID_CONTEXT without a current
 * context. */
CUresult cuMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    SI_ENTER();
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc) {
        const struct si_device *d = &si_devices[ctx->dev];
        *free_bytes = d->capacity - d->used;
        *total_bytes = d->capacity;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}
