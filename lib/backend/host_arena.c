/* The host backend's address arena: where its segments (host_alloc) are
 * placed. One address range per simulated device, reserved at its first
 * segment (PROT_NONE, MAP_NORESERVE: address space only) and four times the
 * device's capacity long, from which segments are handed out first fit at
 * the lowest address that fits, 512-byte aligned, and reused once freed.
 *
 * Why: the cache breaks ties between free blocks of equal size by address
 * (PyTorch's rule), so the order in which a backend hands out addresses
 * decides which block a request splits. The CUDA stand-in hands out
 * cuMemAlloc addresses this way (tests/standin/memory.c), the way cudaMalloc
 * tends to (rising addresses, freed ranges reused from the bottom); with the
 * same order here a replay on the host backend places every block where the
 * cuda backend on the stand-in does, to the byte. mmap, which the host
 * backend used before, hands out falling addresses in no fixed relation to
 * frees.
 *
 * Backed mode makes a segment's pages readable and writable while it is
 * handed out and gives them back to the kernel (MADV_DONTNEED) at its free.
 * Where the range cannot be reserved (a capacity larger than the address
 * space allows), segments fall back to one mmap each. */
#include "backend/backend.h"

#include <string.h>
#include <sys/mman.h>

#define ARENA_ALIGN ((uintptr_t)512)
#define ARENA_MAX_SPAN ((uint64_t)1 << 44) /* 16 TiB of addresses per device at most */

typedef struct extent {
    uintptr_t addr;
    size_t size;
} extent_t;

typedef struct arena {
    uintptr_t base;
    size_t span;
    bool tried; /* the range was asked for (base 0: refused) */
    extent_t *live;
    size_t n, cap;
} arena_t;

static arena_t arenas[TALLY_MAX_DEVICES];

static uintptr_t align_up(uintptr_t v)
{
    return (v + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
}

/* Under the host lock. */
static bool arena_ready(arena_t *a, uint64_t capacity)
{
    if (!a->tried) {
        a->tried = true;
        uint64_t span = capacity > ARENA_MAX_SPAN / 4 ? ARENA_MAX_SPAN : capacity * 4;
        if (span < ((uint64_t)1 << 30))
            span = (uint64_t)1 << 30;
        void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            a->base = (uintptr_t)p;
            a->span = span;
        }
    }
    return a->base != 0;
}

int tally__host_arena_take(int device, size_t size, uint64_t capacity, bool backed, void **out)
{
    tally__mutex_lock(tally__host_lock());
    arena_t *a = &arenas[device];
    int rc = -1;
    if (!arena_ready(a, capacity) || size == 0 || size > a->span)
        goto done;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        extent_t *more = tally__meta_grow(a->live, a->n, cap, sizeof *more);
        if (!more)
            goto done;
        a->live = more;
        a->cap = cap;
    }
    uintptr_t at = align_up(a->base), end = a->base + a->span;
    size_t i = 0;
    for (; i < a->n; i++) {
        if (at + size <= a->live[i].addr)
            break;
        at = align_up(a->live[i].addr + a->live[i].size);
    }
    if (at + size > end)
        goto done;
    if (backed && mprotect((void *)at, size, PROT_READ | PROT_WRITE) != 0)
        goto done;
    memmove(&a->live[i + 1], &a->live[i], (a->n - i) * sizeof a->live[0]);
    a->live[i] = (extent_t){at, size};
    a->n++;
    *out = (void *)at;
    rc = 0;
done:
    tally__mutex_unlock(tally__host_lock());
    return rc;
}

bool tally__host_arena_give(int device, void *ptr, size_t size, bool backed)
{
    tally__mutex_lock(tally__host_lock());
    arena_t *a = &arenas[device];
    uintptr_t p = (uintptr_t)ptr;
    bool mine = a->base && p >= a->base && p < a->base + a->span;
    if (mine) {
        size_t lo = 0, hi = a->n;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (a->live[mid].addr < p)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < a->n && a->live[lo].addr == p) {
            if (backed) {
                madvise(ptr, size, MADV_DONTNEED);
                mprotect(ptr, size, PROT_NONE);
            }
            memmove(&a->live[lo], &a->live[lo + 1], (a->n - lo - 1) * sizeof a->live[0]);
            a->n--;
        }
    }
    tally__mutex_unlock(tally__host_lock());
    return mine;
}
