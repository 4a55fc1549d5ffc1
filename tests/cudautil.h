/* Helpers for tally's C tests that talk to the CUDA driver API directly:
 * on this machine the CUDA stand-in (build/standin/libcuda.so.1, found
 * through LD_LIBRARY_PATH as `make test` sets it), on a GPU machine the real
 * driver (TALLY_REAL_CUDA=1).
 *
 * - cu_load(): dlopen("libcuda.so.1") by the ordinary search path and fill
 *   `cu`, one function pointer per entry point of lib/backend/cuda/driver.h, through
 *   cuGetProcAddress(_v2) with the CUDA version driver.h declares. Entry
 *   points the driver is too old for stay NULL.
 * - CU_OK(call): the call returns CUDA_SUCCESS, else the test fails with the
 *   error's name.
 * - cu_hold(stream) / cu_release(hold): a host function that blocks the
 *   stream until released, so that the work queued behind it stays pending
 *   (CUDA_ERROR_NOT_READY), on the stand-in and on a GPU alike.
 * - cu_ctx_active(dev): whether the device's primary context is active.
 * - cu_is_standin(): the loaded driver is the stand-in (it exports
 *   cuda_standin_version): for the few checks that only make sense there.
 * - cu_calls(name) / cu_calls_reset(): the stand-in's count of calls per
 *   entry point (-1 on a real driver), for paths that must make none.
 * - Test fixtures: cu_test_init(), cu_ctx_setup / cu_ctx_teardown,
 *   CU_NEED_DRIVER() / CU_NEED_TWO() / CU_NEED_STANDIN() (skip unless).
 *
 * Bodies are static: this header is included by test programs only. */
#ifndef TALLY_TESTS_CUDAUTIL_H
#define TALLY_TESTS_CUDAUTIL_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/driver.h"
#include "skip.h"

struct cu_api {
#define CU_API_FIELD(name, version, required, params) tally_pfn_##name name;
    TALLY_CU_ENTRY_POINTS(CU_API_FIELD)
#undef CU_API_FIELD
};

static struct cu_api cu __attribute__((unused));
static void *cu_lib __attribute__((unused));
static int cu_driver_version __attribute__((unused));
static char cu_load_error[256] __attribute__((unused));

/* The two forms of cuGetProcAddress that `lib` exports (NULL if absent). */
static inline void cu_proc_address_fns(void *lib, tally_pfn_cuGetProcAddress_v2 *v2, tally_pfn_cuGetProcAddress *v1)
{
    void *sym = dlsym(lib, "cuGetProcAddress_v2");
    memcpy(v2, &sym, sizeof sym);
    sym = dlsym(lib, "cuGetProcAddress");
    memcpy(v1, &sym, sizeof sym);
}

/* Open libcuda.so.1 and fill `cu`. 0 on success; -1 with cu_load_error set
 * when there is no driver or it lacks cuGetProcAddress. */
static inline int cu_load(void)
{
    if (cu_lib)
        return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(cu_load_error, sizeof cu_load_error, "dlopen libcuda.so.1: %s", dlerror());
        return -1;
    }
    tally_pfn_cuGetProcAddress_v2 gpa2 = NULL;
    tally_pfn_cuGetProcAddress gpa = NULL;
    cu_proc_address_fns(lib, &gpa2, &gpa);
    if (!gpa2 && !gpa) {
        snprintf(cu_load_error, sizeof cu_load_error, "libcuda.so.1 has no cuGetProcAddress");
        dlclose(lib);
        return -1;
    }
    void *pfn = NULL;
    int rc = gpa2 ? gpa2("cuDriverGetVersion", &pfn, 2020, CU_GET_PROC_ADDRESS_DEFAULT, NULL)
                  : gpa("cuDriverGetVersion", &pfn, 2020, CU_GET_PROC_ADDRESS_DEFAULT);
    if (rc != CUDA_SUCCESS || !pfn) {
        snprintf(cu_load_error, sizeof cu_load_error, "cuGetProcAddress(cuDriverGetVersion) failed: %d", rc);
        dlclose(lib);
        return -1;
    }
    memcpy(&cu.cuDriverGetVersion, &pfn, sizeof pfn);
    if (cu.cuDriverGetVersion(&cu_driver_version) != CUDA_SUCCESS)
        cu_driver_version = 0;
#define CU_API_GET(name, version, required, params)                                                                \
    do {                                                                                                           \
        void *p_ = NULL;                                                                                           \
        CUdriverProcAddressQueryResult st_ = CU_GET_PROC_ADDRESS_SUCCESS;                                          \
        int r_ = CUDA_ERROR_NOT_FOUND;                                                                             \
        if ((version) <= cu_driver_version)                                                                        \
            r_ = gpa2 ? gpa2(#name, &p_, (version), CU_GET_PROC_ADDRESS_DEFAULT, &st_)                             \
                      : gpa(#name, &p_, (version), CU_GET_PROC_ADDRESS_DEFAULT);                                   \
        if (r_ != CUDA_SUCCESS || st_ != CU_GET_PROC_ADDRESS_SUCCESS)                                              \
            p_ = NULL;                                                                                             \
        memcpy(&cu.name, &p_, sizeof p_);                                                                          \
    } while (0);
    TALLY_CU_ENTRY_POINTS(CU_API_GET)
#undef CU_API_GET
    cu_lib = lib;
    return 0;
}

/* The error's name ("CUDA_ERROR_OUT_OF_MEMORY"), or its number. */
static inline const char *cu_err_name(CUresult rc)
{
    static char unknown[32];
    const char *name = NULL;
    if (cu.cuGetErrorName && cu.cuGetErrorName(rc, &name) == CUDA_SUCCESS && name)
        return name;
    snprintf(unknown, sizeof unknown, "CUresult %d", rc);
    return unknown;
}

/* call == CUDA_SUCCESS, else fail showing the call and the error. */
#define CU_OK(call)                                                                                                \
    do {                                                                                                           \
        CUresult cu_ok_rc_ = (call);                                                                               \
        if (cu_ok_rc_ != CUDA_SUCCESS)                                                                             \
            fail_msg("%s:%d: %s returned %s", __FILE__, __LINE__, #call, cu_err_name(cu_ok_rc_));                  \
    } while (0)

/* call returns `expected` (a CUresult), else fail showing both names. */
#define CU_IS(call, expected)                                                                                      \
    do {                                                                                                           \
        CUresult cu_is_rc_ = (call), cu_is_ex_ = (expected);                                                       \
        if (cu_is_rc_ != cu_is_ex_)                                                                                \
            fail_msg("%s:%d: %s returned %s, expected %s", __FILE__, __LINE__, #call, cu_err_name(cu_is_rc_),      \
                     cu_err_name(cu_is_ex_));                                                                      \
    } while (0)

/* ---- holding a stream -------------------------------------------------- */
struct cu_hold {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, released;
};

static inline void cu_hold_fn(void *arg)
{
    struct cu_hold *h = (struct cu_hold *)arg;
    pthread_mutex_lock(&h->mu);
    h->started = 1;
    pthread_cond_broadcast(&h->cv);
    while (!h->released)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Queue a host function on `stream` that blocks it until cu_release. NULL
 * when cuLaunchHostFunc fails (the hold is then not queued). A hold queued
 * on a capturing stream is captured, never run: it is then never freed. */
static inline struct cu_hold *cu_hold(CUstream stream)
{
    struct cu_hold *h = (struct cu_hold *)calloc(1, sizeof *h);
    if (!h)
        return NULL;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (!cu.cuLaunchHostFunc || cu.cuLaunchHostFunc(stream, cu_hold_fn, h) != CUDA_SUCCESS) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return NULL;
    }
    return h;
}

/* Let the held stream go on. The hold frees itself once its function ran. */
static inline void cu_release(struct cu_hold *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->released = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* 1 when the primary context of `dev` is active, 0 when not, -1 on error. */
static inline int cu_ctx_active(CUdevice dev)
{
    unsigned int flags = 0;
    int active = 0;
    if (cu.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
        return -1;
    return active ? 1 : 0;
}

/* The loaded libcuda.so.1 is tally's CUDA stand-in. */
static inline int cu_is_standin(void)
{
    return cu_lib && dlsym(cu_lib, "cuda_standin_version") != NULL;
}

/* Calls of the entry point `name` (driver.h's plain name; NULL: all of
 * them) counted by the stand-in since the last cu_calls_reset(), in every
 * thread; -1 on a real driver (which counts nothing). */
static inline long long cu_calls(const char *name)
{
    void *sym = cu_lib ? dlsym(cu_lib, "cuda_standin_calls") : NULL;
    unsigned long long (*fn)(const char *) = NULL;
    if (!sym)
        return -1;
    memcpy(&fn, &sym, sizeof sym);
    return (long long)fn(name);
}

static inline void cu_calls_reset(void)
{
    void *sym = cu_lib ? dlsym(cu_lib, "cuda_standin_counts_reset") : NULL;
    void (*fn)(void) = NULL;
    if (!sym)
        return;
    memcpy(&fn, &sym, sizeof sym);
    fn();
}

/* ---- test fixtures -------------------------------------------------------------------------------- */
/* cu_test_init() in main: load the driver, cuInit, count devices (cu_ndev
 * stays 0 when any step fails, and CU_NEED_DRIVER() then skips).
 * cu_ctx_setup / cu_ctx_teardown (cmocka fixtures) retain and release the
 * primary contexts of devices 0 and 1 (cu_ctx[1] == cu_ctx[0] with one
 * device) and leave no context current. */
static int cu_ndev __attribute__((unused));         /* devices; 0 when the driver did not load */
static CUcontext cu_ctx[2] __attribute__((unused)); /* primary contexts of devices 0 and 1 */

static inline int cu_need_driver(void)
{
    if (cu_ndev == 0) {
        print_message("no CUDA driver: %s\n", cu_load_error[0] ? cu_load_error : "cuInit failed");
        return 0;
    }
    return 1;
}

/* Retain the primary contexts of devices 0 and 1 (1 = 0 with one device). */
static inline int cu_ctx_setup(void **state)
{
    if (cu_ndev == 0)
        return 0;
    if (cu.cuDevicePrimaryCtxRetain(&cu_ctx[0], 0) != CUDA_SUCCESS)
        return -1;
    cu_ctx[1] = cu_ctx[0];
    if (cu_ndev > 1 && cu.cuDevicePrimaryCtxRetain(&cu_ctx[1], 1) != CUDA_SUCCESS)
        return -1;
    return 0;
}

static inline int cu_ctx_teardown(void **state)
{
    if (cu_ndev == 0)
        return 0;
    CUcontext c = NULL;
    while (cu.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c)
        cu.cuCtxPopCurrent(&c);
    cu.cuDevicePrimaryCtxRelease(0);
    if (cu_ndev > 1)
        cu.cuDevicePrimaryCtxRelease(1);
    return 0;
}

#define CU_NEED_DRIVER()                                                                                           \
    do {                                                                                                           \
        if (!cu_need_driver())                                                                                     \
            SKIP("no libcuda.so.1 (the stand-in is in build/standin)");                                                                                                \
    } while (0)
#define CU_NEED_TWO()                                                                                              \
    do {                                                                                                           \
        CU_NEED_DRIVER();                                                                                          \
        if (cu_ndev < 2)                                                                                           \
            SKIP("needs 2 devices, the driver has %d", cu_ndev);                                                                                                \
    } while (0)
#define CU_NEED_STANDIN()                                                                                          \
    do {                                                                                                           \
        CU_NEED_DRIVER();                                                                                          \
        if (!cu_is_standin())                                                                                      \
            SKIP("checks only the CUDA stand-in's own figures");                                                                                                \
    } while (0)

static inline void cu_test_init(void)
{
    if (cu_load() == 0 && cu.cuInit(0) == CUDA_SUCCESS && cu.cuDeviceGetCount(&cu_ndev) != CUDA_SUCCESS)
        cu_ndev = 0;
}

#endif /* TALLY_TESTS_CUDAUTIL_H */
