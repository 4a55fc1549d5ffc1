/* The CUDA stand-in: cuInit, configuration, devices, fork.
 *
 * Configuration, read once at cuInit from the environment:
 *   CUDA_STANDIN_DEVICES         physical devices (default 2, at most 16)
 *   CUDA_STANDIN_MEMORY          bytes per device (default 16G; K/M/G suffixes)
 *   CUDA_STANDIN_DRIVER_VERSION  what cuDriverGetVersion reports (default
 *                                13000); entry points newer than it are not
 *                                found by cuGetProcAddress
 *   CUDA_VISIBLE_DEVICES         which physical devices are visible, in order
 *   CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE  1: cuStreamGetDevice works on
 *                                a capturing stream (default 0: refused, as
 *                                on the drivers that reject it; stream.c)
 *   CUDA_STANDIN_VMM_RDMA        what the device reports for
 *                                CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
 *                                (default 1)
 *   CUDA_STANDIN_VMM_UNMAP_ONE   1: cuMemUnmap takes one whole mapping per
 *                                call, a range of several is refused
 *                                (default 0; vmm.c)
 * A malformed CUDA_STANDIN_* value makes cuInit fail with
 * CUDA_ERROR_INVALID_VALUE and one line on stderr.
 *
 * Simplifications: device attributes other than the four tally asks for
 * are refused with CUDA_ERROR_INVALID_VALUE; CUDA_VISIBLE_DEVICES accepts
 * ordinals only (no GPU-UUID or MIG forms). */
#include "standin.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

SI_EXPORT const int cuda_standin_version = 1;

struct si_config si_config;
struct si_device si_devices[SI_MAX_DEVICES];
pthread_mutex_t si_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t si_cond = PTHREAD_COND_INITIALIZER;

enum { SI_NOT_INITIALIZED, SI_READY, SI_FAILED };
static int si_state = SI_NOT_INITIALIZED;
static CUresult si_init_result = CUDA_ERROR_NOT_INITIALIZED;
static volatile int si_forked;

/* CUDA cannot be used in a child forked after CUDA was initialised: the
 * driver does not duplicate its state into the child, and there every call
 * returns CUDA_ERROR_NOT_INITIALIZED, cuInit included ("initialization
 * error"; cuda.h, CUDA_ERROR_NOT_INITIALIZED: 'This indicates that the CUDA
 * driver has not been initialized with cuInit() or that initialization has
 * failed'; observed as cuInit's rc=3 in a forked child, triton-lang/triton
 * PR 10443, and tensorflow issue 57877). The handler runs in the child only,
 * so a lock another thread held at fork is never taken there. */
static void si_atfork_child(void)
{
    if (si_state != SI_NOT_INITIALIZED)
        si_forked = 1;
}

__attribute__((constructor)) static void si_register_atfork(void)
{
    pthread_atfork(NULL, NULL, si_atfork_child);
}

CUresult si_usable(void)
{
    if (si_forked)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* cuInit: 'If cuInit() has not been called, any function from the driver
     * API will return CUDA_ERROR_NOT_INITIALIZED.' A failed cuInit leaves
     * the driver uninitialised (the error's description above). */
    if (__atomic_load_n(&si_state, __ATOMIC_ACQUIRE) != SI_READY)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

size_t si_parse_bytes(const char *text)
{
    if (!text || !*text)
        return 0;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || text[0] == '-')
        return 0;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end == 'i' && shift)
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v == 0 || v > (SIZE_MAX >> shift))
        return 0;
    return (size_t)v << shift;
}

/* A decimal integer in [lo, hi], or -1. */
static long si_parse_int(const char *text, long lo, long hi)
{
    if (!text || !*text)
        return -1;
    errno = 0;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    return v;
}

int si_driver_version(void)
{
    if (si_state == SI_READY)
        return si_config.driver_version;
    const char *v = getenv("CUDA_STANDIN_DRIVER_VERSION");
    long n = v ? si_parse_int(v, 1000, 1000000) : 13000;
    return n > 0 ? (int)n : 13000;
}

/* CUDA Programming Guide, "CUDA Environment Variables", CUDA_VISIBLE_DEVICES:
 * a comma-separated sequence of device indices; only the devices listed are
 * visible, in that order; 'If one of the indices is invalid, only the devices
 * whose index precedes the invalid index are visible'. An unset variable
 * shows every device; an empty one, or one whose first index is invalid,
 * shows none (cuInit then fails with CUDA_ERROR_NO_DEVICE, one of cuInit's
 * documented results). A repeated index counts as invalid (the guide does not
 * say; the stand-in's choice). */
static int si_parse_visible(const char *list, int physical, int *map)
{
    if (!list) {
        for (int i = 0; i < physical; i++)
            map[i] = i;
        return physical;
    }
    int n = 0;
    const char *p = list;
    while (*p && n < SI_MAX_DEVICES) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item)
            break;
        memcpy(item, p, len);
        item[len] = '\0';
        long ord = si_parse_int(item, 0, physical - 1);
        if (ord < 0)
            break;
        bool seen = false;
        for (int i = 0; i < n; i++)
            seen = seen || map[i] == ord;
        if (seen)
            break;
        map[n++] = (int)ord;
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

static CUresult si_configure(void)
{
    const char *d = getenv("CUDA_STANDIN_DEVICES");
    const char *m = getenv("CUDA_STANDIN_MEMORY");
    const char *v = getenv("CUDA_STANDIN_DRIVER_VERSION");
    long physical = d ? si_parse_int(d, 0, SI_MAX_DEVICES) : 2;
    size_t memory = m ? si_parse_bytes(m) : (size_t)16 << 30;
    long version = v ? si_parse_int(v, 1000, 1000000) : 13000;
    const char *g = getenv("CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE");
    long get_device = g ? si_parse_int(g, 0, 1) : 0;
    if (get_device < 0) {
        fprintf(stderr, "cuda stand-in: bad configuration: CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE=%s (0 or 1)\n", g);
        return CUDA_ERROR_INVALID_VALUE;
    }
    si_config.stream_device_in_capture = get_device == 1;
    const char *r = getenv("CUDA_STANDIN_VMM_RDMA");
    long rdma = r ? si_parse_int(r, 0, 1) : 1;
    if (rdma < 0) {
        fprintf(stderr, "cuda stand-in: bad configuration: CUDA_STANDIN_VMM_RDMA=%s (0 or 1)\n", r);
        return CUDA_ERROR_INVALID_VALUE;
    }
    si_config.vmm_rdma = (int)rdma;
    const char *u = getenv("CUDA_STANDIN_VMM_UNMAP_ONE");
    long unmap_one = u ? si_parse_int(u, 0, 1) : 0;
    if (unmap_one < 0) {
        fprintf(stderr, "cuda stand-in: bad configuration: CUDA_STANDIN_VMM_UNMAP_ONE=%s (0 or 1)\n", u);
        return CUDA_ERROR_INVALID_VALUE;
    }
    si_config.vmm_unmap_one = unmap_one == 1;
    if (physical < 0 || memory == 0 || version < 0) {
        fprintf(stderr, "cuda stand-in: bad configuration: CUDA_STANDIN_DEVICES=%s CUDA_STANDIN_MEMORY=%s "
                        "CUDA_STANDIN_DRIVER_VERSION=%s\n", d ? d : "(unset)", m ? m : "(unset)", v ? v : "(unset)");
        return CUDA_ERROR_INVALID_VALUE;
    }
    si_config.memory = memory;
    si_config.driver_version = (int)version;
    si_config.devices = si_parse_visible(getenv("CUDA_VISIBLE_DEVICES"), (int)physical, si_config.physical);
    if (si_config.devices == 0)
        return CUDA_ERROR_NO_DEVICE;
    /* Addresses: four times the capacity per device, so that freed ranges
     * leave room to place new ones (first fit). */
    size_t span = memory * 4 < ((size_t)1 << 30) ? (size_t)1 << 30 : memory * 4;
    for (int i = 0; i < si_config.devices; i++) {
        struct si_device *dev = &si_devices[i];
        dev->capacity = memory;
        if (si_arena_init(&dev->arena, span) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        dev->ctx.dev = i;
        /* What an active primary context costs: real contexts take hundreds
         * of MiB of device memory (code, stacks, heaps); the stand-in charges
         * 256 MiB, or a sixteenth of a smaller device, so that a stray
         * context shows in cuMemGetInfo. */
        dev->ctx.charge = memory / 16 < ((size_t)256 << 20) ? memory / 16 : (size_t)256 << 20;
    }
    return CUDA_SUCCESS;
}

/* cuInit: 'Initializes the driver API and must be called before any other
 * function from the driver API in the current process. Currently, the Flags
 * parameter must be 0.' */
CUresult cuInit(unsigned int flags)
{
    if (si_forked)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    if (si_state == SI_NOT_INITIALIZED) {
        si_init_result = si_configure();
        __atomic_store_n(&si_state, si_init_result == CUDA_SUCCESS ? SI_READY : SI_FAILED, __ATOMIC_RELEASE);
    }
    CUresult rc = si_init_result;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuDriverGetVersion: 'Returns in *driverVersion the version of CUDA
 * supported by the driver ... returns CUDA_ERROR_INVALID_VALUE if
 * driverVersion is NULL.' Usable before cuInit (it is how a program checks
 * the driver before initialising it). */
CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = si_driver_version();
    return CUDA_SUCCESS;
}

bool si_valid_device(CUdevice dev)
{
    return dev >= 0 && dev < si_config.devices;
}

bool si_charge(int dev, size_t bytes)
{
    struct si_device *d = &si_devices[dev];
    if (bytes > d->capacity - d->used)
        return false;
    d->used += bytes;
    return true;
}

void si_uncharge(int dev, size_t bytes)
{
    struct si_device *d = &si_devices[dev];
    d->used = bytes > d->used ? 0 : d->used - bytes;
}

CUresult cuDeviceGetCount(int *count)
{
    SI_ENTER();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = si_config.devices;
    return CUDA_SUCCESS;
}

/* cuDeviceGet: ordinal 'in the range [0, cuDeviceGetCount()-1]'; otherwise
 * CUDA_ERROR_INVALID_DEVICE. */
CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    SI_ENTER();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    SI_ENTER();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *value = si_config.physical[dev] + 1; /* shows CUDA_VISIBLE_DEVICES' mapping */
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        *value = 1;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
        *value = si_config.vmm_rdma; /* CUDA_STANDIN_VMM_RDMA */
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* cuDeviceTotalMem: 'Returns in *bytes the total amount of memory available
 * on the device'. */
CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    SI_ENTER();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = si_devices[dev].capacity;
    return CUDA_SUCCESS;
}

/* cuDeviceCanAccessPeer: '*canAccessPeer a value of 1 if contexts on dev are
 * capable of directly accessing memory from contexts on peerDev'. Every pair
 * of distinct stand-in devices can; a device is not its own peer. */
CUresult cuDeviceCanAccessPeer(int *can_access, CUdevice dev, CUdevice peer)
{
    SI_ENTER();
    if (!can_access)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(dev) || !si_valid_device(peer))
        return CUDA_ERROR_INVALID_DEVICE;
    *can_access = dev != peer;
    return CUDA_SUCCESS;
}
