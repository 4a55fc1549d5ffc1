/* The CUDA stand-in: virtual memory management (the driver calls behind
 * expandable segments).
 *
 * Reservations are address ranges only (one shared arena, no capacity
 * charged); cuMemCreate makes a physical handle charged to its device;
 * cuMemMap places a handle in a reservation. Rules (cuda.h):
 * - cuMemCreate: 'The size of this allocation must be a multiple of the the
 *   value given via cuMemGetAllocationGranularity with the
 *   CU_MEM_ALLOC_GRANULARITY_MINIMUM flag' (else CUDA_ERROR_INVALID_VALUE);
 *   CUDA_ERROR_OUT_OF_MEMORY when the device is full.
 * - cuMemMap: 'This range must be an address reservation previously reserved
 *   with cuMemAddressReserve ... Both ptr, size, and offset must be a multiple
 *   of the value given via cuMemGetAllocationGranularity ... offset -
 *   currently must be zero ... flags ... must be zero now ... cuMemMap can
 *   only create mappings on VA range reservations that are not currently
 *   mapped.'
 * - cuMemSetAccess: 'The range must be a fully mapped address range'.
 * - cuMemUnmap: 'The range must be the entire contiguous address range that
 *   was mapped to ... cuMemUnmap cannot unmap a sub-range ... Any backing
 *   memory allocations will be freed if there are no existing mappings and
 *   there are no unreleased memory handles.'
 * - cuMemRelease: 'The memory allocation will be freed when all outstanding
 *   mappings to the memory are unmapped and when all outstanding references
 *   to the handle ... are also released. The generic memory handle can be
 *   freed when there are still outstanding mappings made with this handle.'
 * - cuMemAddressFree: 'The size must match what was given to
 *   memAddressReserve and the ptr given must match what was returned'.
 * - cuMemAddressReserve: 'The size and address parameters must be a multiple
 *   of the host page size and the alignment must be a power of two or zero
 *   ... flags - Currently unused, must be zero'.
 * The granularity is 2 MiB (minimum and recommended).
 *
 * - Reserved addresses hold no memory until mapped, and a mapping is usable
 *   only after cuMemSetAccess ('Set the access flags for each location
 *   specified in desc for the given virtual address range'; cuMemCreate:
 *   the allocation is created 'without any device or host mappings'): a
 *   reservation is PROT_NONE; cuMemSetAccess makes its mappings readable
 *   (CU_MEM_ACCESS_FLAGS_PROT_READ) or readable and writable (PROT_READWRITE)
 *   for the program, the highest flag of its descriptors.
 * - A handle's memory is its own, wherever it is mapped. The CUDA C++
 *   Programming Guide's virtual memory chapter ("Virtual Aliasing Support"):
 *   several cuMemMap calls of one allocation at different virtual addresses
 *   make several proxies of the same memory. So every handle is a piece of
 *   one memory file (memfd) and a
 *   mapping maps that piece (MAP_SHARED): two mappings of one handle show
 *   the same bytes, and a handle kept unreleased keeps its contents when
 *   unmapped and mapped again. (The guide adds that writes through one proxy
 *   are coherent with another only once the writing operation completes; on
 *   host memory they always are, a stand-in that is kinder than CUDA there.)
 * - What is unmapped is lost once its handle goes: cuMemUnmap frees the
 *   backing memory of a released handle ('Any backing memory allocations
 *   will be freed if there are no existing mappings and there are no
 *   unreleased memory handles'), so the stand-in punches the handle's piece
 *   out of the file (zeros on the next use of that piece) and an unmapped
 *   range is reserved address space again, PROT_NONE until it is mapped and
 *   given access. A restore after an unmap and release must therefore copy
 *   the contents back itself.
 *
 * Simplifications: access flags are per range for the whole process, not per
 * device; a child forked while handles are mapped shares their memory with
 * its parent (CUDA's device memory is no host memory at all, and the child
 * cannot use CUDA: init.c); a reservation
 * still holding mappings cannot be freed (the documentation does not say;
 * the stand-in refuses with CUDA_ERROR_INVALID_VALUE); handles are not
 * shareable. */
#include "standin.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct si_handle {
    size_t size;
    size_t offset; /* where its memory is in si_phys_fd */
    int dev;
    bool released;
    int maps;
    struct si_handle *next;
};

struct si_mapping {
    uintptr_t addr;
    size_t size;
    int access; /* CU_MEM_ACCESS_FLAGS_PROT_* set by cuMemSetAccess */
    struct si_handle *handle;
    struct si_mapping *next;
};

static struct si_arena si_va;
static bool si_va_ready;
static struct si_handle *si_handles;
static struct si_mapping *si_mappings;

/* Physical memory: one sparse memory file; a handle is a piece of it, placed
 * first fit by an arena of offsets (its numbers start at SI_PHYS_BASE, since
 * an arena's 0 means "full"). */
#define SI_PHYS_BASE SI_GRANULARITY
static int si_phys_fd = -1;
static struct si_arena si_phys;

/* Open the memory file on first use; false when the system refuses. Called
 * under si_lock. Handles are charged to their devices first, so what is live
 * never exceeds the devices' memory; the file is four times that, so first
 * fit always finds room. */
static bool si_phys_ready(void)
{
    if (si_phys_fd >= 0)
        return true;
    size_t span = si_config.memory * (size_t)si_config.devices * 4;
    int fd = memfd_create("cuda-standin-vmm", MFD_CLOEXEC);
    if (fd < 0)
        return false;
    if (ftruncate(fd, (off_t)span) != 0) {
        close(fd);
        return false;
    }
    si_phys = (struct si_arena){.base = (char *)SI_PHYS_BASE, .span = span};
    si_phys_fd = fd;
    return true;
}

static CUresult si_prop_check(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    SI_ENTER();
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    rc = si_prop_check(prop);
    if (!rc)
        *granularity = SI_GRANULARITY;
    return rc;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    SI_ENTER();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!ptr || flags != 0 || size == 0 || size % page || addr % page || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    if (!si_va_ready) {
        size_t span = si_config.memory * (size_t)si_config.devices * 16;
        if (span < ((size_t)64 << 30))
            span = (size_t)64 << 30;
        si_va_ready = si_arena_init(&si_va, span) == 0;
    }
    uintptr_t at = 0;
    if (si_va_ready)
        at = si_arena_take(&si_va, size, alignment > SI_GRANULARITY ? alignment : SI_GRANULARITY, SI_EXTENT_RESERVE,
                           NULL);
    if (at) {
        *ptr = (CUdeviceptr)at;
        mprotect((void *)at, size, PROT_NONE); /* no memory until mapped and given access */
    } else {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* The reservation that holds [addr, addr + size), or NULL. */
static struct si_extent *si_reservation_of(uintptr_t addr, size_t size)
{
    if (!si_va_ready)
        return NULL;
    for (size_t i = 0; i < si_va.count; i++) {
        struct si_extent *e = &si_va.live[i];
        if (addr >= e->addr && addr + size <= e->addr + e->size && addr + size > addr)
            return e;
    }
    return NULL;
}

static bool si_overlaps_mapping(uintptr_t addr, size_t size)
{
    for (struct si_mapping *m = si_mappings; m; m = m->next)
        if (addr < m->addr + m->size && m->addr < addr + size)
            return true;
    return false;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct si_extent *e = si_va_ready ? si_arena_find(&si_va, (uintptr_t)ptr) : NULL;
    if (!e || e->size != size || si_overlaps_mapping(e->addr, e->size))
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        si_arena_give(&si_va, e);
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* How many cuMemCreate calls asked for gpuDirectRDMACapable memory
 * (CUmemAllocationProp.allocFlags: 'This flag if set indicates that the memory
 * will be used as a buffer for GPU Direct RDMA'; the stand-in models no RDMA
 * and only counts it, for tests). */
static unsigned long long si_rdma_creates;

SI_EXPORT unsigned long long cuda_standin_rdma_creates(void)
{
    pthread_mutex_lock(&si_lock);
    unsigned long long n = si_rdma_creates;
    pthread_mutex_unlock(&si_lock);
    return n;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    SI_ENTER();
    if (!handle || flags != 0 || size == 0 || size % SI_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    rc = si_prop_check(prop);
    if (rc)
        return rc;
    struct si_handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&si_lock);
    uintptr_t piece = 0;
    if (!si_charge(prop->location.id, size)) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        free(h);
    } else if (!si_phys_ready() ||
               !(piece = si_arena_take(&si_phys, size, SI_GRANULARITY, SI_EXTENT_ALLOC, NULL))) {
        si_uncharge(prop->location.id, size);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        free(h);
    } else {
        *h = (struct si_handle){
            .size = size, .offset = piece - SI_PHYS_BASE, .dev = prop->location.id, .next = si_handles};
        si_handles = h;
        if (prop->allocFlags.gpuDirectRDMACapable)
            si_rdma_creates++;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

static struct si_handle *si_handle_find(CUmemGenericAllocationHandle handle)
{
    for (struct si_handle *h = si_handles; h; h = h->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)h == handle)
            return h;
    return NULL;
}

/* The physical memory returns to its device once released and unmapped. */
static void si_handle_maybe_free(struct si_handle *h)
{
    if (!h->released || h->maps > 0)
        return;
    si_uncharge(h->dev, h->size);
    /* The memory is gone: a later handle on this piece starts from zeros. */
    fallocate(si_phys_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)h->offset, (off_t)h->size);
    si_arena_drop(&si_phys, si_arena_find(&si_phys, SI_PHYS_BASE + h->offset));
    for (struct si_handle **p = &si_handles; *p; p = &(*p)->next) {
        if (*p == h) {
            *p = h->next;
            break;
        }
    }
    free(h);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct si_handle *h = si_handle_find(handle);
    if (!h || h->released) {
        rc = CUDA_ERROR_INVALID_VALUE; /* 'If handle is not a valid handle the behavior is undefined' */
    } else {
        h->released = true;
        si_handle_maybe_free(h);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    SI_ENTER();
    if (flags != 0 || offset != 0 || size == 0 || ptr % SI_GRANULARITY || size % SI_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    struct si_mapping *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&si_lock);
    struct si_handle *h = si_handle_find(handle);
    if (!h || h->released || size > h->size || !si_reservation_of((uintptr_t)ptr, size) ||
        si_overlaps_mapping((uintptr_t)ptr, size)) {
        rc = CUDA_ERROR_INVALID_VALUE;
        free(m);
    } else if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, si_phys_fd, (off_t)h->offset) ==
               MAP_FAILED) {
        rc = CUDA_ERROR_OUT_OF_MEMORY; /* the system's limit on mappings */
        free(m);
    } else {
        /* The handle's memory at ptr, usable once cuMemSetAccess allows it. */
        *m = (struct si_mapping){.addr = (uintptr_t)ptr, .size = size, .handle = h, .next = si_mappings};
        si_mappings = m;
        h->maps++;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* [addr, addr + size) is exactly covered by whole mappings, without gaps. */
static bool si_covered_by_mappings(uintptr_t addr, size_t size, bool whole)
{
    uintptr_t at = addr, end = addr + size;
    while (at < end) {
        struct si_mapping *hit = NULL;
        for (struct si_mapping *m = si_mappings; m && !hit; m = m->next)
            if (whole ? m->addr == at : (m->addr <= at && at < m->addr + m->size))
                hit = m;
        if (!hit || (whole && hit->addr + hit->size > end))
            return false;
        at = hit->addr + hit->size;
    }
    return size > 0;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
    int inside = 0; /* CUDA_STANDIN_VMM_UNMAP_ONE: a driver that takes one whole mapping per call */
    for (struct si_mapping *m = si_mappings; m && si_config.vmm_unmap_one; m = m->next)
        inside += m->addr >= lo && m->addr + m->size <= hi;
    if (!si_covered_by_mappings(lo, size, true) || inside > 1) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (struct si_mapping **p = &si_mappings; *p;) {
            struct si_mapping *m = *p;
            if (m->addr >= lo && m->addr + m->size <= hi) {
                si_count_mappings(__func__, 1);
                /* Reserved address space again; the contents stay with the
                 * handle until it is freed. */
                mmap((void *)m->addr, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
                     0);
                *p = m->next;
                m->handle->maps--;
                si_handle_maybe_free(m->handle);
                free(m);
            } else {
                p = &m->next;
            }
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    SI_ENTER();
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            return CUDA_ERROR_INVALID_VALUE;
        if (!si_valid_device(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&si_lock);
    if (!si_covered_by_mappings((uintptr_t)ptr, size, false)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        /* The cost model charges per mapping the range covers (cost.h). */
        unsigned long long n = 0;
        int flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        for (size_t i = 0; i < count; i++)
            flags = (int)desc[i].flags > flags ? (int)desc[i].flags : flags;
        for (struct si_mapping *m = si_mappings; m; m = m->next)
            if (m->addr < (uintptr_t)ptr + size && (uintptr_t)ptr < m->addr + m->size) {
                n++;
                m->access = flags;
            }
        si_count_mappings(__func__, n);
        int prot = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                               : PROT_NONE;
        mprotect((void *)(uintptr_t)ptr, size, prot);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

bool si_vmm_accessible(uintptr_t addr, size_t size, bool write)
{
    int need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
    uintptr_t at = addr, end = addr + size;
    if (end <= addr)
        return false;
    while (at < end) {
        struct si_mapping *hit = NULL;
        for (struct si_mapping *m = si_mappings; m && !hit; m = m->next)
            if (m->addr <= at && at < m->addr + m->size)
                hit = m;
        if (!hit || hit->access < need)
            return false;
        at = hit->addr + hit->size;
    }
    return true;
}
