/* The cuda backend's address-space functions (backend.h: reserve, map,
 * unmap, unreserve), on CUDA's virtual memory management API, for
 * expandable segments (lib/cache/expand.c decides what is mapped where; this file
 * only carries it out on the device).
 *
 * - reserve: cuMemAddressReserve of the size rounded up to a page, aligned
 *   to a page. The first reserve on a device checks that the device
 *   supports virtual memory management
 *   (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) and that its
 *   allocation granularity (cuMemGetAllocationGranularity, minimum) divides
 *   the cache's 2 MiB page; otherwise it refuses with one line saying so.
 * - map of n pages in handles of `handle` bytes (backend.h): per handle,
 *   cuMemCreate (that much pinned memory on the device) + cuMemMap at its
 *   address; then one cuMemSetAccess (read-write for the device) over the n
 *   pages. 2h + 1 driver calls for h handles: 2n + 1 with a handle per
 *   page, 3 with one handle. The handle is kept until it is unmapped.
 * - unmap of a range: refused (nothing unmapped) if it would cut a handle;
 *   else cuCtxSynchronize (work still queued may use the pages: a block is
 *   reused in stream order, so the last block on a page may have been freed
 *   while its kernels run), then one cuMemUnmap per run of mapped pages in
 *   the range, then cuMemRelease of each handle taken down. 2 driver calls
 *   for one run, plus one per handle. If the synchronise is refused
 *   (a capture under way: lib/cache/expand.c never unmaps then) nothing is
 *   unmapped and the unmap fails.
 * - unreserve: unmap what is still mapped, then cuMemAddressFree.
 *
 * - keep_handles (on around one move of pages, lib/cache/expand.c, with
 *   moves unlimited): the one-page handles unmapped meanwhile stay
 *   unreleased, and maps of one-page handles take them before calling
 *   cuMemCreate; off releases those left. A handle keeps its memory while
 *   unmapped (cuMemRelease frees it only once released and unmapped) and
 *   may be mapped at another address (cuMemMap of any handle at offset 0),
 *   so a moved page costs its unmap and its map, not also a cuMemRelease
 *   there and a cuMemCreate here (docs/benchmarks.md, run W).
 *
 * Handles: kept (at their first page) while mapped and released once
 * unmapped, as PyTorch's expandable segments do: CUDA frees a handle's
 * memory once it is released and no longer mapped (cuMemRelease: 'The
 * memory allocation will be freed when all outstanding mappings to the
 * memory are unmapped'). Releasing at once after the map (what this file
 * did until issue 21) gives the same memory but charges a cuMemRelease to
 * every map; kept, a job that never unmaps never pays it. A mapping can
 * only be unmapped whole (cuMemUnmap
 * 'cannot unmap a sub-range') and mapped only from offset 0 of its handle,
 * so lib/cache/expand.c gives back whole handles only: pages of a multi-page
 * handle go back together once none holds a live block. One cuMemUnmap may
 * cover several whole mappings (the stand-in allows it; NVIDIA's
 * vectorAddMMAP sample unmaps chunks mapped one by one with one call); if
 * the driver refuses (CUDA_ERROR_INVALID_VALUE), the run is unmapped
 * mapping by mapping.
 *
 * Two bitmaps per reservation say which pages are mapped and which begin a
 * handle, so a map over a mapped page, an unmap that would cut a handle, or
 * an unmap of pages that are not mapped is refused (or skipped) before CUDA
 * sees it, and unreserve knows what is left.
 *
 * Every call runs in the device's primary context (the guard of
 * context.c: pushed only when another context, or none, is current) in the
 * relaxed stream-capture mode, like cuMemAlloc. Out of memory from
 * cuMemCreate is TALLY_ENOMEM (the cache then releases what it holds and
 * retries); the pages this call had mapped are unmapped first.
 *
 * Peers: CUDA's peer access (cuCtxEnablePeerAccess) does not extend to
 * memory from cuMemCreate: a peer needs its own cuMemSetAccess, and no
 * driver call tells which peers the program enabled (PyTorch's pluggable
 * allocator does not pass enablePeerAccess on). The program says so with
 * tally_pool_peer_access(device, peer), as for async pools: the pages
 * already mapped get one cuMemSetAccess per run for the peer, and every
 * later map sets access for the device and its peers in its one call.
 *
 * Runs with the device's lock held (backend.h), which also guards the
 * device's list of reservations and peers. */
#include "backend/cuda/vmm.h"

#include <stdio.h>
#include <string.h>

/* The page lib/cache/expand.c maps in (its PAGE). */
#define VMM_PAGE ((size_t)2 << 20)

typedef struct vmm_range {
    uintptr_t base;
    size_t size, npages;
    uint64_t *mapped; /* bit p: page p is mapped */
    uint64_t *start;  /* bit p: page p is mapped and the first page of its handle */
    CUmemGenericAllocationHandle *handle; /* first page of a mapped handle: the handle */
    struct vmm_range *next;
} vmm_range_t;

static vmm_range_t *ranges[TALLY_MAX_DEVICES];
/* Bit q: device q may read and write the device's pages. */
static uint64_t peers[TALLY_MAX_DEVICES];
/* Per device: 0 not checked yet, 1 usable, -1 refused (refusal says why). */
static int usable[TALLY_MAX_DEVICES];
static char refusal[TALLY_MAX_DEVICES][256];

static bool bit(const vmm_range_t *r, size_t p)
{
    return r->mapped[p >> 6] >> (p & 63) & 1;
}

static bool starts(const vmm_range_t *r, size_t p)
{
    return r->start[p >> 6] >> (p & 63) & 1;
}

/* Pages [p, p + n) mapped (on: as one handle) or unmapped. */
static void set_bits(vmm_range_t *r, size_t p, size_t n, bool on)
{
    for (size_t q = p; q < p + n; q++) {
        if (on)
            r->mapped[q >> 6] |= 1ull << (q & 63);
        else
            r->mapped[q >> 6] &= ~(1ull << (q & 63));
        r->start[q >> 6] &= ~(1ull << (q & 63));
    }
    if (on && n)
        r->start[p >> 6] |= 1ull << (p & 63);
}

/* Whether unmapping [p, p + n) would cut a handle: the first page mapped
 * but not a handle's first, or the page after it mapped and not one. */
static bool cuts_handle(const vmm_range_t *r, size_t p, size_t n)
{
    return (bit(r, p) && !starts(r, p)) || (p + n < r->npages && bit(r, p + n) && !starts(r, p + n));
}

/* Read-write access for device, then for each device in mask; the count. */
static size_t access_list(int device, uint64_t mask, CUmemAccessDesc desc[TALLY_MAX_DEVICES + 1])
{
    size_t n = 0;
    for (int q = -1; q < TALLY_MAX_DEVICES; q++) {
        if (q >= 0 && !(mask >> q & 1))
            continue;
        memset(&desc[n], 0, sizeof desc[n]);
        desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[n].location.id = q < 0 ? device : q;
        desc[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        n++;
    }
    return n;
}

/* Devices whose pages are asked to be GPUDirect RDMA capable: those that
 * report CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (read in
 * check_device). Without the flag, RDMA registration of the memory (NCCL's
 * user buffers over InfiniBand) fails or falls back; PyTorch and NCCL set it
 * the same way. */
static bool rdma[TALLY_MAX_DEVICES];

static CUmemAllocationProp page_prop(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.allocFlags.gpuDirectRDMACapable = rdma[device] ? 1 : 0;
    return prop;
}

/* Whether the driver and the device can do it; checked once per device. */
static int check_device(int device, char *why, size_t whylen)
{
    if (usable[device] == 0) {
        char *msg = refusal[device];
        size_t len = sizeof refusal[device];
        const char *fmt = "%s: expandable_segments cannot be used on device %d";
        int ok = 0;
        if (!tally__cu.cuMemAddressReserve || !tally__cu.cuMemAddressFree || !tally__cu.cuMemCreate ||
            !tally__cu.cuMemRelease || !tally__cu.cuMemMap || !tally__cu.cuMemUnmap || !tally__cu.cuMemSetAccess ||
            !tally__cu.cuMemGetAllocationGranularity) {
            snprintf(msg, len, fmt, "the driver lacks CUDA's virtual memory management (cuMemCreate)", device);
        } else {
            CUdevice dev = 0;
            int vmm = 0;
            CUresult r = tally__cu.cuDeviceGet(&dev, device);
            if (r == CUDA_SUCCESS)
                r = tally__cu.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
            size_t gran = 0;
            CUmemAllocationProp prop = page_prop(device);
            if (r != CUDA_SUCCESS) {
                char cu_why[160];
                tally__cu_why(r, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", cu_why, sizeof cu_why);
                snprintf(msg, len, fmt, cu_why, device);
            } else if (!vmm) {
                snprintf(msg, len, fmt,
                         "no virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
                         device);
            } else if ((r = tally__cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)) !=
                       CUDA_SUCCESS) {
                char cu_why[160];
                tally__cu_why(r, "cuMemGetAllocationGranularity", cu_why, sizeof cu_why);
                snprintf(msg, len, fmt, cu_why, device);
            } else if (gran == 0 || VMM_PAGE % gran) {
                char what[96];
                snprintf(what, sizeof what, "allocation granularity %zu bytes does not divide the 2 MiB page", gran);
                snprintf(msg, len, fmt, what, device);
            } else {
                int can = 0; /* an old driver may not know the attribute: then no RDMA flag */
                rdma[device] = tally__cu.cuDeviceGetAttribute(
                                   &can, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev) ==
                                   CUDA_SUCCESS &&
                               can;
                ok = 1;
            }
        }
        usable[device] = ok ? 1 : -1;
    }
    if (usable[device] > 0)
        return 0;
    snprintf(why, whylen, "%s", refusal[device]);
    return TALLY_EBACKEND;
}

/* The reservation holding [addr, addr + size), or NULL. */
static vmm_range_t *range_of(int device, uintptr_t addr, size_t size)
{
    for (vmm_range_t *r = ranges[device]; r; r = r->next)
        if (addr >= r->base && size <= r->size && addr - r->base <= r->size - size)
            return r;
    return NULL;
}

/* Pages [p, p + n) of r as a page range, checked: 0, or EBACKEND with why. */
static int pages_of(int device, void *ptr, size_t size, vmm_range_t **r, size_t *p, size_t *n, const char *what,
                    char *why, size_t whylen)
{
    uintptr_t a = (uintptr_t)ptr;
    *r = range_of(device, a, size);
    if (!*r || size == 0) {
        snprintf(why, whylen, "%s: [%p, +%zu) is not inside a reservation of device %d", what, ptr, size, device);
        return TALLY_EBACKEND;
    }
    if ((a - (*r)->base) % VMM_PAGE || size % VMM_PAGE) {
        snprintf(why, whylen, "%s: [%p, +%zu) is not a whole number of 2 MiB pages", what, ptr, size);
        return TALLY_EBACKEND;
    }
    *p = (a - (*r)->base) / VMM_PAGE;
    *n = size / VMM_PAGE;
    return 0;
}

int tally__cu_vmm_reserve(int device, size_t size, void **ptr, char *why, size_t whylen)
{
    tally_cu_guard_t g;
    int rc = tally__cu_enter(&g, device, why, whylen);
    if (rc)
        return TALLY_EBACKEND;
    rc = check_device(device, why, whylen);
    if (rc) {
        tally__cu_leave(&g);
        return rc;
    }
    size_t npages = size / VMM_PAGE + (size % VMM_PAGE != 0);
    vmm_range_t *r = tally__meta_calloc(sizeof *r);
    uint64_t *bits = tally__meta_calloc((npages / 64 + 1) * sizeof *bits);
    uint64_t *start = tally__meta_calloc((npages / 64 + 1) * sizeof *start);
    CUmemGenericAllocationHandle *handle = tally__meta_calloc(npages * sizeof *handle);
    CUdeviceptr base = 0;
    CUresult cr = CUDA_SUCCESS;
    if (!r || !bits || !start || !handle) {
        snprintf(why, whylen, "out of host memory for a reservation of %zu bytes", size);
        rc = TALLY_ENOMEM;
    } else if ((cr = tally__cu.cuMemAddressReserve(&base, npages * VMM_PAGE, VMM_PAGE, 0, 0)) != CUDA_SUCCESS) {
        rc = tally__cu_why(cr, "cuMemAddressReserve", why, whylen);
    }
    tally__cu_leave(&g);
    if (rc) {
        tally__meta_free(r);
        tally__meta_free(bits);
        tally__meta_free(start);
        tally__meta_free(handle);
        return rc;
    }
    *r = (vmm_range_t){.base = (uintptr_t)base, .size = npages * VMM_PAGE, .npages = npages, .mapped = bits,
                       .start = start, .handle = handle, .next = ranges[device]};
    ranges[device] = r;
    *ptr = (void *)(uintptr_t)base;
    return 0;
}

/* One-page handles kept unreleased while the cache moves pages
 * (tally__cu_vmm_keep): the maps of the same move take them instead of
 * making new ones. */
typedef struct kept {
    bool on;
    size_t n, cap;
    CUmemGenericAllocationHandle *h;
} kept_t;

static kept_t kept[TALLY_MAX_DEVICES];

/* Keep h for the next map, when keeping is on and there is room. */
static bool keep_handle(int device, CUmemGenericAllocationHandle h)
{
    kept_t *k = &kept[device];
    if (!k->on)
        return false;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 64;
        CUmemGenericAllocationHandle *grown = tally__meta_grow(k->h, k->n, cap, sizeof *grown);
        if (!grown)
            return false;
        k->h = grown;
        k->cap = cap;
    }
    k->h[k->n++] = h;
    return true;
}

void tally__cu_vmm_keep(int device, bool on)
{
    kept_t *k = &kept[device];
    k->on = on;
    if (on || !k->n)
        return;
    /* The move is over: what no map took goes back to the device. */
    tally_cu_guard_t g;
    bool entered = tally__cu_enter_used(&g, device) == 0;
    for (size_t i = 0; i < k->n; i++) {
        CUresult res = tally__cu.cuMemRelease(k->h[i]);
        if (res != CUDA_SUCCESS)
            tally__cu_fail(res, "cuMemRelease", device);
    }
    k->n = 0;
    if (entered)
        tally__cu_leave(&g);
}

/* Release the handles whose first page is in [p, p + n) of r (just
 * unmapped, not yet marked so: their memory goes back to the device), or
 * keep the one-page ones for the next map while a move is under way. */
static void release_handles(int device, vmm_range_t *r, size_t p, size_t n)
{
    for (size_t q = p; q < p + n; q++) {
        if (!starts(r, q) || !r->handle[q])
            continue;
        bool one_page = q + 1 >= r->npages || !bit(r, q + 1) || starts(r, q + 1);
        if (one_page && keep_handle(device, r->handle[q])) {
            r->handle[q] = 0;
            continue;
        }
        CUresult res = tally__cu.cuMemRelease(r->handle[q]);
        if (res != CUDA_SUCCESS)
            tally__cu_fail(res, "cuMemRelease", device);
        r->handle[q] = 0;
    }
}

/* Unmap pages [p, p + n) of r (all mapped, whole handles) in one call,
 * else mapping by mapping, and release their handles. In the device's
 * context. Returns the first failure, or CUDA_SUCCESS. */
static CUresult unmap_run(int device, vmm_range_t *r, size_t p, size_t n)
{
    CUdeviceptr at = (CUdeviceptr)(r->base + p * VMM_PAGE);
    CUresult res = tally__cu.cuMemUnmap(at, n * VMM_PAGE);
    if (res == CUDA_ERROR_INVALID_VALUE && n > 1) {
        /* A driver that takes one whole mapping per call. */
        res = CUDA_SUCCESS;
        for (size_t i = 0; i < n;) {
            size_t k = 1;
            while (i + k < n && !starts(r, p + i + k))
                k++;
            CUresult one = tally__cu.cuMemUnmap(at + i * VMM_PAGE, k * VMM_PAGE);
            if (one == CUDA_SUCCESS) {
                release_handles(device, r, p + i, k);
                set_bits(r, p + i, k, false);
            } else if (res == CUDA_SUCCESS)
                res = one;
            i += k;
        }
        if (res != CUDA_SUCCESS)
            tally__cu_fail(res, "cuMemUnmap", device);
        return res;
    }
    if (res == CUDA_SUCCESS) {
        release_handles(device, r, p, n);
        set_bits(r, p, n, false);
    } else {
        tally__cu_fail(res, "cuMemUnmap", device);
    }
    return res;
}

/* Unmap every mapped page of [p, p + n) of r, in runs. In the device's
 * context. Waits for nothing: the caller has waited for the streams that
 * used the pages (lib/cache/expand.c: the segment's stream; other streams' uses
 * are held back by events until done), never for the whole device (a
 * cuCtxSynchronize would wait for every stream, NCCL's included, and is
 * refused during a capture). */
static CUresult unmap_pages(int device, vmm_range_t *r, size_t p, size_t n)
{
    CUresult res = CUDA_SUCCESS;
    for (size_t q = p; q < p + n;) {
        if (!bit(r, q)) {
            q++;
            continue;
        }
        size_t k = 1;
        while (q + k < p + n && bit(r, q + k))
            k++;
        CUresult one = unmap_run(device, r, q, k);
        if (res == CUDA_SUCCESS)
            res = one;
        q += k;
    }
    return res;
}

int tally__cu_vmm_map(int device, void *ptr, size_t size, size_t handle, char *why, size_t whylen)
{
    vmm_range_t *r;
    size_t p, n;
    int rc = pages_of(device, ptr, size, &r, &p, &n, "map", why, whylen);
    if (rc)
        return rc;
    if (handle < VMM_PAGE || handle % VMM_PAGE) {
        snprintf(why, whylen, "map: handle size %zu is not a whole number of 2 MiB pages", handle);
        return TALLY_EBACKEND;
    }
    size_t hp = handle / VMM_PAGE;
    for (size_t q = p; q < p + n; q++) {
        if (bit(r, q)) {
            snprintf(why, whylen, "map: page at %p of device %d is already mapped", (void *)(r->base + q * VMM_PAGE),
                     device);
            return TALLY_EBACKEND;
        }
    }
    tally_cu_guard_t g;
    if (tally__cu_enter(&g, device, why, whylen))
        return TALLY_EBACKEND;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    CUmemAllocationProp prop = page_prop(device);
    for (size_t done = 0; done < n && !rc; done += hp) {
        CUdeviceptr at = (CUdeviceptr)(r->base + (p + done) * VMM_PAGE);
        size_t k = n - done < hp ? n - done : hp;
        CUmemGenericAllocationHandle h = 0;
        CUresult cr = CUDA_SUCCESS;
        if (k == 1 && kept[device].n)
            h = kept[device].h[--kept[device].n]; /* a page the same move unmapped */
        else
            cr = tally__cu.cuMemCreate(&h, k * VMM_PAGE, &prop, 0);
        if (cr != CUDA_SUCCESS) {
            rc = tally__cu_why(cr, "cuMemCreate", why, whylen);
            break;
        }
        cr = tally__cu.cuMemMap(at, k * VMM_PAGE, 0, h, 0);
        if (cr != CUDA_SUCCESS) {
            tally__cu.cuMemRelease(h);
            rc = tally__cu_why(cr, "cuMemMap", why, whylen);
            break;
        }
        set_bits(r, p + done, k, true);
        r->handle[p + done] = h; /* released when unmapped */
    }
    if (!rc) {
        CUmemAccessDesc access[TALLY_MAX_DEVICES + 1];
        size_t count = access_list(device, peers[device], access);
        CUresult cr = tally__cu.cuMemSetAccess((CUdeviceptr)(r->base + p * VMM_PAGE), n * VMM_PAGE, access, count);
        if (cr != CUDA_SUCCESS)
            rc = tally__cu_why(cr, "cuMemSetAccess", why, whylen);
    }
    if (rc) /* nothing of this call stays mapped; its memory goes back */
        unmap_pages(device, r, p, n);
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    tally__cu_leave(&g);
    return rc;
}

/* In the device's context and the relaxed capture mode: unmap the mapped
 * pages of [p, p + n) of r (the caller waited for their streams) and, with
 * release, free r's addresses (*freed: cuMemAddressFree's result). */
static int give_back(int device, vmm_range_t *r, size_t p, size_t n, bool release, CUresult *freed)
{
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device))
        return TALLY_EBACKEND;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    CUresult res = unmap_pages(device, r, p, n);
    if (release && res != CUDA_SUCCESS)
        *freed = res; /* pages still mapped: the addresses stay reserved */
    else if (release)
        *freed = tally__cu.cuMemAddressFree((CUdeviceptr)r->base, r->size);
    tally__cu.cuThreadExchangeStreamCaptureMode(&mode);
    tally__cu_leave(&g);
    return res == CUDA_SUCCESS ? 0 : TALLY_EBACKEND;
}

int tally__cu_vmm_unmap(int device, void *ptr, size_t size)
{
    char why[200];
    vmm_range_t *r;
    size_t p, n;
    int rc = pages_of(device, ptr, size, &r, &p, &n, "unmap", why, sizeof why);
    if (rc) {
        tally__fail(rc, "device %d: %s", device, why);
        return rc;
    }
    if (cuts_handle(r, p, n)) {
        tally__fail(TALLY_EBACKEND, "device %d: unmap of [%p, +%zu) would cut a physical handle", device, ptr, size);
        return TALLY_EBACKEND;
    }
    CUresult freed = CUDA_SUCCESS;
    return give_back(device, r, p, n, false, &freed);
}

int tally__cu_vmm_unreserve(int device, void *ptr, size_t size)
{
    vmm_range_t **link = &ranges[device];
    while (*link && (*link)->base != (uintptr_t)ptr)
        link = &(*link)->next;
    vmm_range_t *r = *link;
    if (!r || size > r->size) {
        tally__fail(TALLY_EBACKEND, "device %d: unreserve: %p (%zu bytes) is not a reservation", device, ptr, size);
        return TALLY_EBACKEND;
    }
    CUresult fr = CUDA_ERROR_INVALID_CONTEXT;
    int rc = give_back(device, r, 0, r->npages, true, &fr);
    if (fr != CUDA_SUCCESS) {
        /* Kept on the list: its pages may still be mapped. A refused
         * unmap (rc) has said so already. */
        if (!rc)
            tally__cu_fail(fr, "cuMemAddressFree", device);
        return TALLY_EBACKEND;
    }
    *link = r->next;
    tally__meta_free(r->mapped);
    tally__meta_free(r->start);
    tally__meta_free(r->handle);
    tally__meta_free(r);
    return rc;
}

int tally__cu_vmm_peer_access(int device, int peer, char *why, size_t whylen)
{
    if (!tally__opt.expandable_segments)
        return 0; /* cuMemAlloc memory follows the program's peer access */
    CUdevice dev = 0, pdev = 0;
    int can = 1;
    CUresult r = tally__cu.cuDeviceGet(&dev, device);
    if (r == CUDA_SUCCESS)
        r = tally__cu.cuDeviceGet(&pdev, peer);
    if (r == CUDA_SUCCESS && tally__cu.cuDeviceCanAccessPeer)
        r = tally__cu.cuDeviceCanAccessPeer(&can, pdev, dev);
    if (r != CUDA_SUCCESS) {
        tally__cu_why(r, "cuDeviceCanAccessPeer", why, whylen);
        return TALLY_EBACKEND;
    }
    if (!can) {
        snprintf(why, whylen, "device %d cannot access device %d's memory (cuDeviceCanAccessPeer is 0)", peer, device);
        return TALLY_EBACKEND;
    }
    peers[device] |= (uint64_t)1 << peer;
    if (!ranges[device])
        return 0; /* later maps include the peer */
    tally_cu_guard_t g;
    if (tally__cu_enter_used(&g, device)) {
        snprintf(why, whylen, "no context of device %d to set access in", device);
        return TALLY_EBACKEND;
    }
    CUmemAccessDesc access[TALLY_MAX_DEVICES + 1];
    access_list(peer, 0, access);
    int rc = 0;
    for (vmm_range_t *rg = ranges[device]; rg && !rc; rg = rg->next) {
        for (size_t q = 0; q < rg->npages && !rc;) {
            if (!bit(rg, q)) {
                q++;
                continue;
            }
            size_t k = 1;
            while (q + k < rg->npages && bit(rg, q + k))
                k++;
            r = tally__cu.cuMemSetAccess((CUdeviceptr)(rg->base + q * VMM_PAGE), k * VMM_PAGE, access, 1);
            if (r != CUDA_SUCCESS) {
                tally__cu_why(r, "cuMemSetAccess", why, whylen);
                rc = TALLY_EBACKEND;
            }
            q += k;
        }
    }
    tally__cu_leave(&g);
    return rc;
}

size_t tally__cu_vmm_mapped_bytes(int device)
{
    size_t pages = 0;
    if (device < 0 || device >= TALLY_MAX_DEVICES)
        return 0;
    for (const vmm_range_t *r = ranges[device]; r; r = r->next)
        for (size_t p = 0; p < r->npages; p++)
            pages += bit(r, p);
    return pages * VMM_PAGE;
}
