/* The CUDA stand-in: stream-ordered memory pools (cuMemAllocFromPoolAsync,
 * cuMemFreeAsync) and peer access to them.
 *
 * A pool holds blocks: each allocation is a block of its size rounded up to
 * 512 bytes, taken from the device's addresses and charged to its capacity
 * (the pool's reserved memory). cuMemFreeAsync queues the free on its
 * stream; once the free has executed the block is free, and a later
 * allocation of the same rounded size from any stream reuses it
 * (CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: 'Allow reuse of already
 * completed frees when there is no dependency between the free and
 * allocation'); the freeing stream itself may reuse it at once (stream
 * order: cuMemFreeAsync, 'The allocation must not be accessed after stream
 * execution reaches the free'); another stream may reuse it before the free
 * executed only by waiting for the free (internal dependencies, enabled by
 * default; see si_pool_reuse). Free blocks stay reserved until released:
 * - at synchronisation points (cuStreamSynchronize, cuEventSynchronize,
 *   cuCtxSynchronize) while the pool holds more than its release threshold
 *   (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: 'When more than the release threshold
 *   bytes of memory are held by the memory pool, the allocator will try to
 *   release memory back to the OS on the next call to stream, event or
 *   context synchronize. (default 0)');
 * - by cuMemPoolTrimTo ('Releases memory back to the OS until the pool
 *   contains fewer than minBytesToKeep reserved bytes, or there is no more
 *   memory that the allocator can safely release'; frees not yet executed
 *   'can count as outstanding').
 * Access: the pool's own device always has read-write access; another
 * device has none until cuMemPoolSetAccess grants it (peer access enabled
 * with cuCtxEnablePeerAccess does not extend to pools: ../shared/cuda.md,
 * "Stream-ordered pools").
 *
 * Simplifications: no suballocation (a block is reused only for the same
 * rounded size); no reuse by following event dependencies
 * (CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES); no retry after
 * trimming on out-of-memory.
 *
 * In a capture (capture.c): cuMemAllocAsync on a capturing stream makes a
 * graph allocation (Programming Guide, CUDA Graphs, "Graph Memory Nodes":
 * stream-ordered allocation during capture creates an allocation node),
 * always new memory, charged to the device and counted in the pool like
 * the pool's own blocks (a simplification: CUDA keeps graph memory apart
 * from the pool); cuMemFreeAsync in a capture takes only a graph
 * allocation of that capture (cuMemFreeAsync: 'During stream capture, this
 * function results in the creation of a free node and must therefore be
 * passed the address of a graph allocation'): anything else fails with
 * CUDA_ERROR_INVALID_VALUE (the stand-in's choice of code) and invalidates
 * the capture. A graph allocation freed in its capture belongs to the graph
 * and goes when the graph is destroyed; one not freed there stays
 * allocated, for an eager cuMemFreeAsync after the capture. */
#include "standin.h"

#include <stdlib.h>

struct CUmemPoolHandle_st {
    int dev;
    bool is_default, destroyed;
    cuuint64_t threshold;
    size_t reserved, reserved_high, used, used_high;
    int reuse[3]; /* the REUSE_* attributes (FOLLOW_EVENT_DEPENDENCIES is kept, not acted on) */
    CUmemAccess_flags access[SI_MAX_DEVICES];
    struct si_block *blocks;
    struct CUmemPoolHandle_st *next;
};

static struct CUmemPoolHandle_st *si_pools;

static struct CUmemPoolHandle_st *si_pool_new(int dev, bool is_default)
{
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = dev;
    p->is_default = is_default;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    p->access[dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    p->next = si_pools;
    si_pools = p;
    return p;
}

static bool si_pool_valid(CUmemoryPool pool)
{
    for (struct CUmemPoolHandle_st *p = si_pools; p; p = p->next)
        if (p == pool)
            return !p->destroyed;
    return false;
}

static void si_block_release(struct CUmemPoolHandle_st *p, struct si_block **link)
{
    struct si_block *b = *link;
    struct si_arena *a = &si_devices[p->dev].arena;
    struct si_extent *e = si_arena_find(a, b->addr);
    if (e)
        si_arena_give(a, e);
    si_uncharge(p->dev, b->size);
    p->reserved -= b->size;
    *link = b->next;
    free(b);
}

/* Release free blocks while the pool reserves more than `keep`. */
static void si_pool_trim(struct CUmemPoolHandle_st *p, size_t keep)
{
    for (struct si_block **link = &p->blocks; *link && p->reserved > keep;) {
        if ((*link)->state == SI_BLOCK_FREE)
            si_block_release(p, link);
        else
            link = &(*link)->next;
    }
}

void si_pool_sync_point(int dev)
{
    for (struct CUmemPoolHandle_st *p = si_pools; p; p = p->next)
        if (p->dev == dev && p->reserved > p->threshold)
            si_pool_trim(p, p->threshold > SIZE_MAX ? SIZE_MAX : (size_t)p->threshold);
}

void si_pool_block_freed(struct si_block *b, unsigned long long nth_free)
{
    if (b->state == SI_BLOCK_FREEING && b->frees == nth_free)
        b->state = SI_BLOCK_FREE;
}

void si_pool_graph_destroyed(struct si_capture *c)
{
    for (struct CUmemPoolHandle_st *p = si_pools; p; p = p->next) {
        for (struct si_block **link = &p->blocks; *link;) {
            if ((*link)->graph == c && (*link)->state == SI_BLOCK_GRAPH_FREED)
                si_block_release(p, link);
            else
                link = &(*link)->next;
        }
    }
}

/* cuDeviceGetDefaultMemPool: 'The default mempool of a device contains
 * device memory from that device' (one per device, made at first use). */
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    SI_ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&si_lock);
    struct si_device *d = &si_devices[dev];
    if (!d->default_pool)
        d->default_pool = si_pool_new(dev, true);
    *pool = d->default_pool;
    if (!*pool)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    SI_ENTER();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !si_valid_device(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    *pool = si_pool_new(props->location.id, false);
    if (!*pool)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuMemPoolDestroy: 'A device's default memory pool cannot be destroyed'
 * (CUDA_ERROR_INVALID_VALUE); outstanding blocks are 'released
 * automatically once there are no more outstanding allocations' (the
 * stand-in releases the free ones now and keeps the rest reserved). */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    if (!si_pool_valid(pool) || pool->is_default) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        si_pool_trim(pool, 0);
        pool->destroyed = true;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuMemPoolSetAttribute: RELEASE_THRESHOLD (cuuint64_t); RESERVED_MEM_HIGH
 * and USED_MEM_HIGH (cuuint64_t) reset their watermark ('It is illegal to
 * set this attribute to a non-zero value'; CUmemPool_attribute: 'High
 * watermark can only be reset to zero'); the REUSE_* flags (int: only an int
 * is read). The *_CURRENT attributes are read-only. */
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SI_ENTER();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    bool is_int = attr >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
                  attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
    cuuint64_t v64 = is_int ? 0 : *(cuuint64_t *)value;
    if (!si_pool_valid(pool)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        pool->threshold = v64;
    } else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        if (v64 != 0)
            rc = CUDA_ERROR_INVALID_VALUE;
        else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved;
        else
            pool->used_high = pool->used;
    } else if (is_int) {
        pool->reuse[attr - 1] = *(int *)value != 0;
    } else {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    SI_ENTER();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    if (!si_pool_valid(pool)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        cuuint64_t *out = value;
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *out = pool->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *out = pool->reserved; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *out = pool->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *out = pool->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *out = pool->used_high; break;
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = pool->reuse[attr - 1]; break;
        default: rc = CUDA_ERROR_INVALID_VALUE; break;
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    if (!si_pool_valid(pool))
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        si_pool_trim(pool, min_bytes_to_keep);
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuMemPoolSetAccess: 'Each descriptor instructs the access to enable for a
 * single gpu.' The owner's access stays read-write. */
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    SI_ENTER();
    if (!map && count)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !si_valid_device(map[i].location.id) ||
            (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    if (!si_pool_valid(pool)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (size_t i = 0; i < count; i++)
            if (map[i].location.id != pool->dev)
                pool->access[map[i].location.id] = map[i].flags;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool, CUmemLocation *location)
{
    SI_ENTER();
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE || !si_valid_device(location->id))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    if (!si_pool_valid(pool))
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        *flags = pool->access[location->id];
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* A free block of `size` that stream s may have: one freed on s itself
 * (stream order), one whose free has executed (opportunistic reuse, when
 * enabled), or else one still being freed on another stream, which s must
 * first wait for (*wait: CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
 * 'Allow cuMemAllocAsync to insert new stream dependencies in order to
 * establish the stream ordering required to reuse a piece of memory
 * released by cuMemFreeAsync (default enabled)'). */
static struct si_block *si_pool_reuse(struct CUmemPoolHandle_st *p, size_t size, struct CUstream_st *s, bool *wait)
{
    struct si_block *dep = NULL;
    for (struct si_block *b = p->blocks; b; b = b->next) {
        if (b->size != size || (b->state != SI_BLOCK_FREE && b->state != SI_BLOCK_FREEING))
            continue;
        if (b->freed_on == s || (b->state == SI_BLOCK_FREE && p->reuse[CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC - 1]))
            return b;
        if (!dep && p->reuse[CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES - 1])
            dep = b;
    }
    *wait = dep != NULL;
    return dep;
}

/* cuMemAllocFromPoolAsync: 'Inserts an allocation operation into hStream. A
 * pointer to the allocated memory is returned immediately'; 'The specified
 * memory pool may be from a device different than that of the specified
 * hStream'; CUDA_ERROR_INVALID_CONTEXT for a default stream 'with no current
 * context'; CUDA_ERROR_OUT_OF_MEMORY. */
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    SI_ENTER();
    if (!dptr || bytesize == 0 || bytesize > SIZE_MAX - SI_ALIGN)
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = (bytesize + SI_ALIGN - 1) / SI_ALIGN * SI_ALIGN;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_pool_valid(pool) ? si_stream_get(stream, &s) : CUDA_ERROR_INVALID_VALUE;
    int cap = rc ? (int)rc : si_capture_enqueue(s);
    if (cap != CUDA_SUCCESS && cap != SI_CAPTURED) {
        pthread_mutex_unlock(&si_lock);
        return (CUresult)cap;
    }
    bool wait = false;
    /* A graph allocation is always new memory. */
    struct si_block *b = cap == SI_CAPTURED ? NULL : si_pool_reuse(pool, size, s, &wait);
    if (b && wait) {
        /* The allocating stream waits for the free; not in a capture. */
        struct si_op *op = cap == CUDA_SUCCESS ? si_op_new(SI_OP_WAIT) : NULL;
        if (op) {
            op->wait_stream = b->freed_on;
            op->wait_seq = b->free_seq;
            si_stream_push(s, op);
        } else {
            b = NULL;
        }
    }
    if (!b) {
        b = calloc(1, sizeof *b);
        uintptr_t at = 0;
        if (b && si_charge(pool->dev, size)) {
            at = si_arena_take(&si_devices[pool->dev].arena, size, SI_ALIGN, SI_EXTENT_POOL, NULL);
            if (!at)
                si_uncharge(pool->dev, size);
        }
        if (!at) {
            free(b);
            pthread_mutex_unlock(&si_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *b = (struct si_block){.addr = at, .size = size, .pool = pool, .next = pool->blocks};
        pool->blocks = b;
        pool->reserved += size;
        if (pool->reserved > pool->reserved_high)
            pool->reserved_high = pool->reserved;
    }
    b->state = SI_BLOCK_LIVE;
    b->graph = cap == SI_CAPTURED ? s->capture : NULL;
    pool->used += size;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    *dptr = (CUdeviceptr)b->addr;
    pthread_mutex_unlock(&si_lock);
    return CUDA_SUCCESS;
}

/* cuMemFreeAsync: 'Inserts a free operation into hStream. The allocation
 * must not be accessed after stream execution reaches the free';
 * CUDA_ERROR_INVALID_VALUE for a pointer no pool allocated (the stand-in's
 * reading of its results); CUDA_ERROR_INVALID_CONTEXT for a default stream
 * 'with no current context'. In a capture: a free node, of a graph
 * allocation of that capture only (see the header). */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    SI_ENTER();
    struct si_op *op = si_op_new(SI_OP_POOL_FREE);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&si_lock);
    struct si_block *b = NULL;
    for (struct CUmemPoolHandle_st *p = si_pools; p && !b; p = p->next)
        for (struct si_block *x = p->blocks; x && !b; x = x->next)
            if (x->addr == (uintptr_t)dptr && x->state == SI_BLOCK_LIVE)
                b = x;
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc && s->capture && !s->capture->invalidated && (!b || b->graph != s->capture)) {
        /* In a capture: only a graph allocation of this capture. */
        si_capture_invalidate(s);
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (!rc && !b) {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    int cap = rc ? (int)rc : si_capture_enqueue(s);
    if (cap == SI_CAPTURED) {
        /* A free node: the graph owns the memory from here on. */
        b->state = SI_BLOCK_GRAPH_FREED;
        b->pool->used -= b->size;
    } else if (cap == CUDA_SUCCESS) {
        b->state = SI_BLOCK_FREEING;
        b->freed_on = s;
        b->pool->used -= b->size;
        b->graph = NULL;
        op->block = b;
        op->wait_seq = ++b->frees;
        b->free_seq = si_stream_push(s, op);
        op = NULL;
    }
    rc = cap == SI_CAPTURED ? CUDA_SUCCESS : (CUresult)cap;
    pthread_mutex_unlock(&si_lock);
    free(op);
    return rc;
}
