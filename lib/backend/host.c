/* The host backend: simulated devices in host memory, so the whole cache,
 * ledger and report stack runs and is tested without a GPU.
 *
 * - backed mode: segments are anonymous private mappings the program may
 *   read and write (pages are committed by the OS on first touch).
 * - virtual mode: segments are PROT_NONE reservations with MAP_NORESERVE,
 *   never touched, so an 80 GiB trace replays on a 24 GiB machine.
 * Each simulated device has a capacity; allocation beyond it is an OOM.
 * Streams are opaque pointers. An event completes at once unless its stream
 * is held (tally_host_stream_hold), which models queued work. Fault injection
 * fails chosen allocation calls with out-of-memory.
 *
 * Every call is counted per device (tally_host_calls): allocations and
 * frees, reservations, map calls and the 2 MiB pages they map, unmap calls
 * with the pages they unmap and the runs of neighbouring mapped pages among
 * them, and the physical handles each map lays out (backend.h: handles of
 * `handle` bytes). Per reservation it knows which pages are mapped and the
 * handle each belongs to, so unmap counts what lib/backend/cuda/vmm.c would do for
 * the same call (one cuMemUnmap per run) and refuses, as CUDA does, an
 * unmap that would cut a handle, and a map or unmap that is not whole pages
 * inside one reservation: a replay on this backend gives the driver calls of
 * the cuda one. */
#include "backend/backend.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

typedef struct host_event {
    void *stream;
    uint64_t ticket; /* generation of the hold it was recorded under */
    int device;
    bool pending;
} host_event_t;

#define HOLD_SLOTS 64
typedef struct hold_slot {
    void *stream;
    uint64_t generation; /* unique per hold */
    int held;
} hold_slot_t;

static tally_mutex_t host_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__host_lock(void) { return &host_lock; }
static int ndev;
static uint64_t capacity;
static int mode;
static uint64_t used[TALLY_MAX_DEVICES];
static hold_slot_t holds[HOLD_SLOTS];
static uint64_t fail_countdown, fail_every;

#define HOST_PAGE ((size_t)2 << 20)

/* A reservation, which of its pages are mapped and their handles. */
typedef struct host_range {
    uintptr_t base;
    size_t npages;
    uint8_t *mapped;
    uint32_t *hstart; /* mapped page: the first page of its handle */
    uint32_t *hlen;   /* first page of a handle: its pages */
    struct host_range *next;
} host_range_t;

static host_range_t *host_ranges[TALLY_MAX_DEVICES];
static tally_host_calls_t counts[TALLY_MAX_DEVICES];

static host_range_t *range_locked(int device, uintptr_t a)
{
    for (host_range_t *r = host_ranges[device]; r; r = r->next)
        if (a >= r->base && a - r->base < r->npages * HOST_PAGE)
            return r;
    return NULL;
}

/* Whether an unmap of [ptr, ptr + size) would cut a handle (part of it
 * inside the range, part outside): CUDA refuses such an unmap. */
static bool cuts_handle(int device, void *ptr, size_t size)
{
    tally__mutex_lock(&host_lock);
    uintptr_t a = (uintptr_t)ptr;
    host_range_t *r = range_locked(device, a);
    bool cut = false;
    if (r && (a - r->base) % HOST_PAGE == 0) {
        size_t p = (a - r->base) / HOST_PAGE, end = p + size / HOST_PAGE;
        for (size_t q = p; q < end && q < r->npages && !cut; q++)
            if (r->mapped[q])
                cut = r->hstart[q] < p || r->hstart[q] + r->hlen[r->hstart[q]] > end;
    }
    tally__mutex_unlock(&host_lock);
    return cut;
}

/* Per device while a move keeps handles (host_keep_handles): the one-page
 * handles taken down and not yet mapped again, as lib/backend/cuda/vmm.c
 * keeps them. */
static bool keeping[TALLY_MAX_DEVICES];
static uint64_t kept[TALLY_MAX_DEVICES];

/* Count a map (on, in handles of hpages pages) or unmap (off) of [ptr,
 * ptr + size): pages whose state changes, handles laid out and, for unmap,
 * the runs of neighbouring mapped pages; while handles are kept, the
 * one-page handles taken down, and those a map lays out again. */
static size_t count_pages(int device, void *ptr, size_t size, size_t hpages, bool on)
{
    tally__mutex_lock(&host_lock);
    tally_host_calls_t *c = &counts[device];
    uintptr_t a = (uintptr_t)ptr;
    host_range_t *r = range_locked(device, a);
    size_t n = size / HOST_PAGE, changed = 0, runs = 0, handles = 0;
    if (r && (a - r->base) % HOST_PAGE == 0) {
        size_t p = (a - r->base) / HOST_PAGE;
        bool prev = false;
        for (size_t q = p; q < p + n && q < r->npages; q++) {
            bool was = r->mapped[q];
            if (was != on)
                changed++;
            runs += !on && was && !prev;
            handles += !on && was && r->hstart[q] == q;
            kept[device] += keeping[device] && !on && was && r->hstart[q] == q && r->hlen[q] == 1;
            prev = was;
            r->mapped[q] = on;
            if (on) {
                size_t h = p + (q - p) / hpages * hpages;
                r->hstart[q] = (uint32_t)h;
                if (q == h)
                    r->hlen[h] = (uint32_t)(p + n - h < hpages ? p + n - h : hpages);
            }
        }
    } else { /* not a reservation: count the call as one run of size */
        changed = n;
        runs = !on && n;
    }
    if (on) {
        c->map++;
        c->map_pages += changed;
        c->map_handles += (n + hpages - 1) / hpages;
        /* One-page handles of this layout: every one, or a last short one. */
        uint64_t ones = hpages == 1 ? n : n % hpages == 1;
        uint64_t again = ones < kept[device] ? ones : kept[device];
        c->reused_handles += again;
        kept[device] -= again;
    } else {
        c->unmap++;
        c->unmap_pages += changed;
        c->unmap_runs += runs;
        c->unmap_handles += handles;
    }
    tally__mutex_unlock(&host_lock);
    return changed;
}

static int host_init(const tally_options_t *opt, char *why, size_t whylen)
{
    tally__mutex_lock(&host_lock);
    ndev = opt->host_devices;
    capacity = opt->host_capacity;
    mode = opt->host_mode;
    memset(used, 0, sizeof used);
    memset(counts, 0, sizeof counts);
    tally__mutex_unlock(&host_lock);
    (void)why;
    (void)whylen;
    return 0;
}

static int host_device_count(void)
{
    return ndev;
}

/* Returns true when this call is the injected failure. */
static bool fault_fires_locked(void)
{
    if (!fail_countdown)
        return false;
    if (--fail_countdown)
        return false;
    fail_countdown = fail_every;
    return true;
}

/* Count size bytes against the device's capacity (an allocation or a page
 * mapping), or fail with OOM: injected, or the device is full. */
static int charge(int device, size_t size, char *why, size_t whylen)
{
    tally__mutex_lock(&host_lock);
    if (fault_fires_locked()) {
        tally__mutex_unlock(&host_lock);
        snprintf(why, whylen, "injected allocation failure");
        return TALLY_ENOMEM;
    }
    if (size > capacity - used[device]) {
        tally__mutex_unlock(&host_lock);
        snprintf(why, whylen, "simulated device %d is full (%llu of %llu bytes in use, %zu asked)", device,
                 (unsigned long long)used[device], (unsigned long long)capacity, size);
        return TALLY_ENOMEM;
    }
    used[device] += size;
    tally__mutex_unlock(&host_lock);
    return 0;
}

static int host_alloc(int device, size_t size, void *stream, void **ptr, char *why, size_t whylen)
{
    (void)stream;
    int rc = charge(device, size, why, whylen);
    if (rc)
        return rc;
    int prot = mode == TALLY_HOST_VIRTUAL ? PROT_NONE : PROT_READ | PROT_WRITE;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    /* Addresses in the order the stand-in's cuMemAlloc gives them (host_arena.c). */
    void *p;
    if (tally__host_arena_take(device, size, capacity, mode != TALLY_HOST_VIRTUAL, &p) != 0)
        p = mmap(NULL, size, prot, flags, -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        tally__mutex_lock(&host_lock);
        used[device] -= size;
        tally__mutex_unlock(&host_lock);
        snprintf(why, whylen, "mmap of %zu bytes failed: %s", size, strerror(err));
        return TALLY_ENOMEM;
    }
    *ptr = p;
    tally__mutex_lock(&host_lock);
    counts[device].alloc++;
    tally__mutex_unlock(&host_lock);
    return 0;
}

static int host_free(int device, void *ptr, size_t size, void *stream)
{
    (void)stream;
    if (!tally__host_arena_give(device, ptr, size, mode != TALLY_HOST_VIRTUAL))
        munmap(ptr, size);
    tally__mutex_lock(&host_lock);
    used[device] -= size;
    counts[device].free++;
    tally__mutex_unlock(&host_lock);
    return 0;
}

static int host_reserve(int device, size_t size, void **ptr, char *why, size_t whylen)
{
    host_range_t *r = tally__meta_calloc(sizeof *r);
    uint8_t *mapped = tally__meta_calloc(size / HOST_PAGE + 1);
    uint32_t *hstart = tally__meta_calloc((size / HOST_PAGE + 1) * sizeof *hstart);
    uint32_t *hlen = tally__meta_calloc((size / HOST_PAGE + 1) * sizeof *hlen);
    bool meta = r && mapped && hstart && hlen;
    void *p = meta ? mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) : MAP_FAILED;
    if (p == MAP_FAILED) {
        const char *err = meta ? strerror(errno) : "out of host memory";
        snprintf(why, whylen, "reserving %zu bytes of address space failed: %s", size, err);
        tally__meta_free(r);
        tally__meta_free(mapped);
        tally__meta_free(hstart);
        tally__meta_free(hlen);
        return TALLY_ENOMEM;
    }
    tally__mutex_lock(&host_lock);
    *r = (host_range_t){.base = (uintptr_t)p, .npages = size / HOST_PAGE, .mapped = mapped, .hstart = hstart,
                        .hlen = hlen, .next = host_ranges[device]};
    host_ranges[device] = r;
    counts[device].reserve++;
    tally__mutex_unlock(&host_lock);
    *ptr = p;
    return 0;
}

/* Whether [ptr, ptr + size) is whole pages inside one reservation of
 * device; if not, why says so as lib/backend/cuda/vmm.c does (CUDA maps and
 * unmaps only inside a reservation: cuMemMap and cuMemUnmap refuse any other
 * range with CUDA_ERROR_INVALID_VALUE). */
static bool inside_reservation(int device, void *ptr, size_t size, const char *what, char *why, size_t whylen)
{
    tally__mutex_lock(&host_lock);
    uintptr_t a = (uintptr_t)ptr;
    host_range_t *r = range_locked(device, a);
    bool inside = r && size && size <= (r->npages * HOST_PAGE) - (a - r->base);
    bool whole = r && size % HOST_PAGE == 0 && (a - r->base) % HOST_PAGE == 0;
    tally__mutex_unlock(&host_lock);
    if (!inside)
        snprintf(why, whylen, "%s: [%p, +%zu) is not inside a reservation of device %d", what, ptr, size, device);
    else if (!whole)
        snprintf(why, whylen, "%s: [%p, +%zu) is not a whole number of 2 MiB pages", what, ptr, size);
    return inside && whole;
}

/* Mapping counts against the device's capacity, as an allocation does; in
 * backed mode the pages become usable. */
static int host_map(int device, void *ptr, size_t size, size_t handle, char *why, size_t whylen)
{
    if (handle < HOST_PAGE || handle % HOST_PAGE) {
        snprintf(why, whylen, "map: handle size %zu is not a whole number of 2 MiB pages", handle);
        return TALLY_EBACKEND;
    }
    if (!inside_reservation(device, ptr, size, "map", why, whylen))
        return TALLY_EBACKEND;
    int rc = charge(device, size, why, whylen);
    if (rc)
        return rc;
    if (mode == TALLY_HOST_BACKED && mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0) {
        tally__mutex_lock(&host_lock);
        used[device] -= size;
        tally__mutex_unlock(&host_lock);
        snprintf(why, whylen, "mprotect of %zu bytes failed: %s", size, strerror(errno));
        return TALLY_ENOMEM;
    }
    count_pages(device, ptr, size, handle / HOST_PAGE, true);
    return 0;
}

static int host_unmap(int device, void *ptr, size_t size)
{
    char why[200];
    if (!inside_reservation(device, ptr, size, "unmap", why, sizeof why)) {
        tally__fail(TALLY_EBACKEND, "device %d: %s", device, why);
        return TALLY_EBACKEND;
    }
    if (cuts_handle(device, ptr, size)) {
        tally__fail(TALLY_EBACKEND, "device %d: unmap of [%p, +%zu) would cut a physical handle", device, ptr, size);
        return TALLY_EBACKEND;
    }
    if (mode == TALLY_HOST_BACKED) {
        madvise(ptr, size, MADV_DONTNEED);
        mprotect(ptr, size, PROT_NONE);
    }
    /* Only the pages that were mapped go back to the device. */
    size_t pages = count_pages(device, ptr, size, 1, false);
    tally__mutex_lock(&host_lock);
    used[device] -= pages * HOST_PAGE;
    tally__mutex_unlock(&host_lock);
    return 0;
}

/* backend.h's keep_handles: only counted here (the memory of a handle
 * taken down went back with its pages, as it would with the handle mapped
 * again at once). */
static void host_keep_handles(int device, bool on)
{
    tally__mutex_lock(&host_lock);
    keeping[device] = on;
    kept[device] = 0;
    tally__mutex_unlock(&host_lock);
}

static int host_unreserve(int device, void *ptr, size_t size)
{
    tally__mutex_lock(&host_lock);
    host_range_t **link = &host_ranges[device];
    while (*link && (*link)->base != (uintptr_t)ptr)
        link = &(*link)->next;
    host_range_t *r = *link;
    if (r)
        *link = r->next;
    counts[device].unreserve++;
    tally__mutex_unlock(&host_lock);
    if (r) {
        tally__meta_free(r->mapped);
        tally__meta_free(r->hstart);
        tally__meta_free(r->hlen);
        tally__meta_free(r);
    }
    return munmap(ptr, size) == 0 ? 0 : TALLY_EBACKEND;
}

/* Backups of sleeping blocks: plain host memory (what is pinned on CUDA).
 * Virtual mode holds no contents, so it cannot copy them. */
static int host_host_alloc(int device, size_t size, void **ptr, char *why, size_t whylen)
{
    (void)device;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "host memory for a %zu-byte backup: %s", size, strerror(errno));
        return TALLY_ENOMEM;
    }
    *ptr = p;
    return 0;
}

static void host_host_free(int device, void *ptr, size_t size)
{
    (void)device;
    munmap(ptr, size);
}

static int host_copy(void *dst, const void *src, size_t size, char *why, size_t whylen)
{
    if (mode == TALLY_HOST_VIRTUAL) {
        snprintf(why, whylen, "host_mode:virtual holds no contents (its pages are never touched), so there is "
                 "nothing to offload: use discard, or host_mode:backed");
        return TALLY_EBACKEND;
    }
    memcpy(dst, src, size);
    return 0;
}

static int host_copy_to_host(int device, void *host, const void *dev, size_t size, char *why, size_t whylen)
{
    (void)device;
    return host_copy(host, dev, size, why, whylen);
}

static int host_copy_to_device(int device, void *dev, const void *host, size_t size, char *why, size_t whylen)
{
    (void)device;
    return host_copy(dev, host, size, why, whylen);
}

static int host_mem_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    tally__mutex_lock(&host_lock);
    *free_bytes = (size_t)(capacity - used[device]);
    *total_bytes = (size_t)capacity;
    tally__mutex_unlock(&host_lock);
    return 0;
}

static uint64_t hold_generations;

/* The slot of a held stream, or NULL. */
static hold_slot_t *find_hold_locked(void *stream)
{
    for (int i = 0; i < HOLD_SLOTS; i++)
        if (holds[i].held && holds[i].stream == stream)
            return &holds[i];
    return NULL;
}

static int host_event_create(int device, void **event)
{
    host_event_t *e = tally__meta_calloc(sizeof *e);
    if (!e)
        return TALLY_ENOMEM;
    e->device = device;
    *event = e;
    return 0;
}

static int host_event_record(int device, void *event, void *stream)
{
    (void)device;
    host_event_t *e = event;
    tally__mutex_lock(&host_lock);
    hold_slot_t *h = find_hold_locked(stream);
    e->stream = stream;
    e->pending = h != NULL;
    e->ticket = h ? h->generation : 0;
    tally__mutex_unlock(&host_lock);
    return 0;
}

static int host_event_query(int device, void *event)
{
    (void)device;
    host_event_t *e = event;
    if (!e->pending)
        return 0;
    tally__mutex_lock(&host_lock);
    hold_slot_t *h = find_hold_locked(e->stream);
    /* Complete once the hold that covered it was released (each hold has
     * its own generation, so a later hold of the stream does not count). */
    if (!h || h->generation != e->ticket)
        e->pending = false;
    tally__mutex_unlock(&host_lock);
    return e->pending ? 1 : 0;
}

static int host_event_sync(int device, void *event)
{
    /* Waiting on a held stream models a host thread blocking until the
     * queued work finishes: the work is taken as done. */
    host_event_t *e = event;
    (void)device;
    e->pending = false;
    return 0;
}

static int host_event_destroy(int device, void *event)
{
    (void)device;
    tally__meta_free(event);
    return 0;
}

static int host_synchronize(int device)
{
    (void)device;
    return 0;
}

static void host_shutdown(void)
{
}

int tally__host_stream_hold(void *stream, int hold)
{
    tally__mutex_lock(&host_lock);
    hold_slot_t *h = find_hold_locked(stream);
    if (hold && !h) {
        for (int i = 0; i < HOLD_SLOTS && !h; i++)
            if (!holds[i].held)
                h = &holds[i];
        if (!h) {
            tally__mutex_unlock(&host_lock);
            return tally__fail(TALLY_ENOMEM, "host backend: more than %d streams held at once", HOLD_SLOTS);
        }
        h->stream = stream;
        h->held = 1;
        h->generation = ++hold_generations;
    } else if (!hold && h) {
        h->held = 0;
        h->stream = NULL;
        h->generation = 0;
    }
    tally__mutex_unlock(&host_lock);
    return 0;
}

int tally__host_fail_alloc(uint64_t nth, uint64_t every)
{
    tally__mutex_lock(&host_lock);
    fail_countdown = nth;
    fail_every = every;
    tally__mutex_unlock(&host_lock);
    return 0;
}

int tally__host_calls(int device, tally_host_calls_t *out)
{
    tally__mutex_lock(&host_lock);
    *out = counts[device];
    tally__mutex_unlock(&host_lock);
    return 0;
}

const tally_backend_t tally__backend_host = {
    .name = "host",
    .can_exit_call = true,
    .init = host_init,
    .device_count = host_device_count,
    .alloc = host_alloc,
    .free = host_free,
    .mem_info = host_mem_info,
    .event_create = host_event_create,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
    .event_destroy = host_event_destroy,
    .synchronize = host_synchronize,
    .reserve = host_reserve,
    .map = host_map,
    .unmap = host_unmap,
    .unreserve = host_unreserve,
    .keep_handles = host_keep_handles,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .copy_to_host = host_copy_to_host,
    .copy_to_device = host_copy_to_device,
    .shutdown = host_shutdown,
};
