/* Loading CUDA's driver at run time. libcuda.so.1 (installed with the
 * NVIDIA driver) is opened with dlopen through the ordinary library search
 * path the first time a CUDA backend starts; cuGetProcAddress (the CUDA 12
 * form with a query result where the driver has it, else the CUDA 11.3
 * form) gives every entry point of lib/backend/cuda/driver.h with the CUDA version
 * whose signature is declared there. Required entry points must all be
 * present; optional ones stay NULL when the driver lacks them. Then cuInit,
 * the driver version checked against TALLY_CUDA_MIN_DRIVER, and the device
 * count (cuDeviceGetCount creates no context).
 *
 * libtally.so therefore has no link-time CUDA dependency, runs on any
 * driver from CUDA 11.3 on, and never touches the CUDA runtime: a failure
 * tally handles itself leaves nothing in the runtime's per-thread error
 * state of the program. */
#include "backend/cuda/cu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

tally_cu_t tally__cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_count;
static char load_why[256];
static _Atomic int loaded;

int tally__cu_why(CUresult r, const char *call, char *why, size_t whylen)
{
    const char *name = NULL, *text = NULL;
    if (tally__cu.cuGetErrorName)
        tally__cu.cuGetErrorName(r, &name);
    if (tally__cu.cuGetErrorString)
        tally__cu.cuGetErrorString(r, &text);
    if (name && text)
        snprintf(why, whylen, "%s: %s (%s)", call, name, text);
    else if (name)
        snprintf(why, whylen, "%s: %s", call, name);
    else
        snprintf(why, whylen, "%s: CUDA error %d", call, r);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? TALLY_ENOMEM : TALLY_EBACKEND;
}

int tally__cu_fail(CUresult r, const char *call, int device)
{
    char why[256];
    int code = tally__cu_why(r, call, why, sizeof why);
    return tally__fail(code, "device %d: %s", device, why);
}

/* Take every entry point; the first required one missing fails the load. */
static int take_entry_points(void *lib, char *why, size_t whylen)
{
    /* dlsym gives object pointers; copied into function pointers. */
    tally_pfn_cuGetProcAddress_v2 get2 = NULL;
    tally_pfn_cuGetProcAddress get1 = NULL;
    void *sym2 = dlsym(lib, "cuGetProcAddress_v2"), *sym1 = dlsym(lib, "cuGetProcAddress");
    memcpy(&get2, &sym2, sizeof get2);
    memcpy(&get1, &sym1, sizeof get1);
    if (!get2 && !get1) {
        snprintf(why, whylen, "libcuda.so.1 has no cuGetProcAddress: the NVIDIA driver is older than CUDA %d.%d",
                 TALLY_CUDA_MIN_DRIVER / 1000, TALLY_CUDA_MIN_DRIVER % 1000 / 10);
        return -1;
    }
#define TALLY_CU_TAKE(name, version, required, params)                                                             \
    do {                                                                                                           \
        void *fn = NULL;                                                                                           \
        CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;                                            \
        CUresult r = get2 ? get2(#name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &q)                             \
                          : get1(#name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT);                                \
        if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS)                                                 \
            fn = NULL;                                                                                             \
        *(void **)&tally__cu.name = fn;                                                                            \
        if (!fn && (required)) {                                                                                   \
            snprintf(why, whylen, "the NVIDIA driver's libcuda.so.1 lacks %s (CUDA %d.%d form), which tally needs", \
                     #name, (version) / 1000, (version) % 1000 / 10);                                              \
            return -1;                                                                                             \
        }                                                                                                          \
    } while (0);
    TALLY_CU_ENTRY_POINTS(TALLY_CU_TAKE)
#undef TALLY_CU_TAKE
    /* A second form of one name (driver.h): optional. */
    void *fn = NULL;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = get2 ? get2("cuStreamGetCtx", &fn, TALLY_CU_STREAM_GET_CTX_V2, CU_GET_PROC_ADDRESS_DEFAULT, &q)
                      : get1("cuStreamGetCtx", &fn, TALLY_CU_STREAM_GET_CTX_V2, CU_GET_PROC_ADDRESS_DEFAULT);
    memcpy(&tally__cu.cuStreamGetCtx_v2, &fn, sizeof fn);
    if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS)
        tally__cu.cuStreamGetCtx_v2 = NULL;
    return 0;
}

static void load(void)
{
    char *why = load_why;
    size_t whylen = sizeof load_why;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, whylen, "no libcuda.so.1: no NVIDIA driver on this machine");
        return;
    }
    atomic_store(&loaded, 1);
    if (take_entry_points(lib, why, whylen))
        return;
    CUresult r = tally__cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        tally__cu_why(r, "cuInit", why, whylen);
        return;
    }
    int v = 0;
    r = tally__cu.cuDriverGetVersion(&v);
    if (r != CUDA_SUCCESS) {
        tally__cu_why(r, "cuDriverGetVersion", why, whylen);
        return;
    }
    tally__cu.driver_version = v;
    if (v < TALLY_CUDA_MIN_DRIVER) {
        snprintf(why, whylen, "the NVIDIA driver supports CUDA %d.%d; tally needs %d.%d or newer", v / 1000,
                 v % 1000 / 10, TALLY_CUDA_MIN_DRIVER / 1000, TALLY_CUDA_MIN_DRIVER % 1000 / 10);
        return;
    }
    int n = 0;
    r = tally__cu.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        tally__cu_why(r, "cuDeviceGetCount", why, whylen);
        return;
    }
    if (n <= 0) {
        snprintf(why, whylen, "the NVIDIA driver reports no CUDA device");
        return;
    }
    if (n > TALLY_MAX_DEVICES)
        n = TALLY_MAX_DEVICES;
    tally__cu.ndev = n; /* why stays empty: it names only what went wrong */
    load_count = n;
}

int tally__cu_load(char *why, size_t whylen)
{
    pthread_once(&load_once, load);
    snprintf(why, whylen, "%s", load_why);
    return load_count;
}

bool tally__cu_loaded(void)
{
    return atomic_load(&loaded) != 0;
}

int tally__cu_init(char *why, size_t whylen)
{
    return tally__cu_load(why, whylen) > 0 ? 0 : TALLY_EBACKEND;
}

int tally__cu_device_count(void)
{
    return load_count;
}
