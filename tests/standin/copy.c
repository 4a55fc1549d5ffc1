/* The CUDA stand-in: copies between host and device memory, and pinned host
 * memory (what tally's sleep with offload uses).
 *
 * Rules (cuda.h):
 * - cuMemcpyDtoH: 'Copies from device to host memory. dstHost and srcDevice
 *   specify the base pointers of the destination and source, respectively.
 *   ByteCount specifies the number of bytes to copy'; cuMemcpyHtoD the other
 *   way. Both return CUDA_ERROR_INVALID_CONTEXT without a current context
 *   and CUDA_ERROR_INVALID_VALUE for a bad argument: here a NULL host
 *   pointer, or device addresses that are not wholly inside one cuMemAlloc
 *   allocation or inside mappings given access with cuMemSetAccess (read
 *   access for the source, read-write for the destination). So a copy from
 *   an unmapped page fails, as a kernel touching it would. They are
 *   synchronous ('\note_sync': for transfers from pageable or pinned host
 *   memory the call returns once the copy is done): the copy is made before
 *   the call returns.
 * - cuMemHostAlloc: 'Allocates bytesize bytes of host memory that is
 *   page-locked and accessible to the device ... The memory allocated by this
 *   function must be freed with cuMemFreeHost()'; CUDA_ERROR_OUT_OF_MEMORY
 *   when it cannot, CUDA_ERROR_INVALID_CONTEXT without a current context;
 *   Flags are CU_MEMHOSTALLOC_PORTABLE (0x01), _DEVICEMAP (0x02) and
 *   _WRITECOMBINED (0x04), any other bit CUDA_ERROR_INVALID_VALUE.
 * - cuMemFreeHost: 'Frees the memory space pointed to by p, which must have
 *   been returned by a previous call to' cuMemAllocHost (or cuMemHostAlloc);
 *   anything else is CUDA_ERROR_INVALID_VALUE.
 *
 * Simplifications: pinned memory is ordinary host memory (not locked); the
 * stand-in keeps a list of its blocks to refuse foreign frees. */
#include "standin.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct si_pinned {
    void *p;
    size_t size;
    struct si_pinned *next;
};
static struct si_pinned *si_pinned_list;

static unsigned long long si_mib(size_t bytes)
{
    return (bytes + ((size_t)1 << 20) - 1) >> 20;
}

static bool si_device_range(uintptr_t addr, size_t size, bool write)
{
    return si_alloc_holds(addr, size) || si_vmm_accessible(addr, size, write);
}

CUresult cuMemcpyDtoH(void *dst_host, CUdeviceptr src_device, size_t bytes)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc && (!dst_host || !si_device_range((uintptr_t)src_device, bytes, false)))
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&si_lock);
    si_count_mappings(__func__, si_mib(bytes)); /* the cost table charges per MiB (cost.h) */
    if (!rc)
        memcpy(dst_host, (const void *)(uintptr_t)src_device, bytes);
    return rc;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst_device, const void *src_host, size_t bytes)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc && (!src_host || !si_device_range((uintptr_t)dst_device, bytes, true)))
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&si_lock);
    si_count_mappings(__func__, si_mib(bytes));
    if (!rc)
        memcpy((void *)(uintptr_t)dst_device, src_host, bytes);
    return rc;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    SI_ENTER();
    if (!pp || bytesize == 0 || (flags & ~0x7u))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    struct si_pinned *b = rc ? NULL : calloc(1, sizeof *b);
    void *p = b ? mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (!rc && p == MAP_FAILED) {
        free(b);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (!rc) {
        *b = (struct si_pinned){p, bytesize, si_pinned_list};
        si_pinned_list = b;
        *pp = p;
        si_count_mappings(__func__, si_mib(bytesize));
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

CUresult cuMemFreeHost(void *p)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    struct si_pinned *found = NULL;
    for (struct si_pinned **l = &si_pinned_list; !rc && *l; l = &(*l)->next)
        if ((*l)->p == p) {
            found = *l;
            *l = found->next;
            break;
        }
    if (!rc && !found)
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&si_lock);
    if (found) {
        si_count_mappings(__func__, si_mib(found->size));
        munmap(found->p, found->size);
        free(found);
    }
    return rc;
}
