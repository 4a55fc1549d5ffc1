/* Tests of the CUDA stand-in (tests/standin/, build/standin/libcuda.so.1)
 * through the driver API, as tally's backends use it: loaded with dlopen,
 * entry points taken through cuGetProcAddress (tests/cudautil.h).
 *
 * Each test checks one documented rule the stand-in models (docs/standin.md):
 * here initialisation, configuration, cuGetProcAddress, error names,
 * contexts, device memory and fork; streams, events, capture, virtual
 * memory and pools are in test_standin_streams.c.
 *
 * With TALLY_REAL_CUDA=1 on a GPU machine the same tests run against the real
 * driver: the checks of exact stand-in figures (capacity, context charge,
 * configuration variables, error codes the documentation leaves open) run
 * only when cu_is_standin(). Tests that need two devices skip with fewer.
 *
 * Configurations other than the default run in a fresh process (this
 * program re-executed with --child NAME and the environment set), since the
 * driver reads its configuration once, at cuInit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudautil.h"

#define MiB ((size_t)1 << 20)

/* ---- children: other configurations ---------------------------------------- */
/* In a child, a failed expectation exits with its line number. */
#define CHILD_EXPECT(cond)                                                                                         \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "test_standin child: line %d: %s\n", __LINE__, #cond);                                 \
            exit(__LINE__ % 250 + 1);                                                                              \
        }                                                                                                          \
    } while (0)

static char self_path[4096];

/* Run this program as `--child name` with env ("NAME=value", or "NAME" to
 * unset) applied; its exit status (0: every expectation held). */
static int run_child(const char *name, const char *const *env)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        unsetenv("CUDA_VISIBLE_DEVICES");
        for (; env && *env; env++) {
            const char *eq = strchr(*env, '=');
            if (!eq) {
                unsetenv(*env);
                continue;
            }
            char key[128];
            snprintf(key, sizeof key, "%.*s", (int)(eq - *env), *env);
            setenv(key, eq + 1, 1);
        }
        execl(self_path, self_path, "--child", name, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void child_before_init(void)
{
    int n = -1, v = 0;
    size_t f = 0, t = 0;
    CHILD_EXPECT(cu.cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_EXPECT(cu.cuMemGetInfo(&f, &t) == CUDA_ERROR_NOT_INITIALIZED);
    CHILD_EXPECT(cu.cuDriverGetVersion(&v) == CUDA_SUCCESS && v > 0);
    CHILD_EXPECT(cu.cuInit(1) == CUDA_ERROR_INVALID_VALUE);
    CHILD_EXPECT(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 2);
}

/* CUDA_STANDIN_DEVICES=4 CUDA_VISIBLE_DEVICES=2,0: two devices, physical 2
 * then 0 (the PCI bus id attribute is physical + 1). */
static void child_visible_2_0(void)
{
    int n = 0, bus = 0;
    CHILD_EXPECT(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 2);
    CHILD_EXPECT(cu.cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0) == CUDA_SUCCESS && bus == 3);
    CHILD_EXPECT(cu.cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1) == CUDA_SUCCESS && bus == 1);
    CUdevice d = -1;
    CHILD_EXPECT(cu.cuDeviceGet(&d, 2) == CUDA_ERROR_INVALID_DEVICE);
}

/* An invalid (or repeated) index hides itself and everything after it. */
static void child_visible_1_7_0(void)
{
    int n = 0;
    CHILD_EXPECT(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 1);
}

/* No visible device: cuInit fails, and the driver stays uninitialised. */
static void child_no_device(void)
{
    int n = 0;
    CHILD_EXPECT(cu.cuInit(0) == CUDA_ERROR_NO_DEVICE);
    CHILD_EXPECT(cu.cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
}

/* CUDA_STANDIN_MEMORY=64M: capacity, and allocation up to it. */
static void child_memory_64m(void)
{
    size_t total = 0, free_b = 0;
    CUcontext c = NULL;
    CUdeviceptr p = 0, q = 0;
    CHILD_EXPECT(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS && total == 64 * MiB);
    CHILD_EXPECT(cu.cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuCtxPushCurrent(c) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS && total == 64 * MiB);
    CHILD_EXPECT(free_b == total - 4 * MiB); /* the context's charge: a sixteenth */
    CHILD_EXPECT(cu.cuMemAlloc(&p, free_b) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuMemAlloc(&q, 512) == CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_EXPECT(cu.cuMemFree(p) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuMemAlloc(&q, 512) == CUDA_SUCCESS);
}

static void child_bad_memory(void)
{
    CHILD_EXPECT(cu.cuInit(0) == CUDA_ERROR_INVALID_VALUE);
}

/* CUDA_STANDIN_DRIVER_VERSION=12000: an old driver. */
static void child_driver_12000(void)
{
    int v = 0;
    void *pfn = (void *)&v;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    tally_pfn_cuGetProcAddress_v2 gpa2 = NULL;
    tally_pfn_cuGetProcAddress gpa = NULL;
    cu_proc_address_fns(cu_lib, &gpa2, &gpa);
    CHILD_EXPECT(gpa2 != NULL);
    CHILD_EXPECT(cu.cuDriverGetVersion(&v) == CUDA_SUCCESS && v == 12000);
    CHILD_EXPECT(cu.cuStreamGetDevice == NULL); /* cu_load: 12080 > 12000 */
    CHILD_EXPECT(gpa2("cuStreamGetDevice", &pfn, 12000, 0, &st) == CUDA_SUCCESS);
    CHILD_EXPECT(pfn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHILD_EXPECT(gpa2("cuMemAlloc", &pfn, 12080, 0, &st) == CUDA_ERROR_INVALID_VALUE);
    CHILD_EXPECT(gpa2("cuStreamGetCtx", &pfn, 12000, 0, &st) == CUDA_SUCCESS &&
                 pfn == dlsym(cu_lib, "cuStreamGetCtx")); /* the 9.2 form only */
    CHILD_EXPECT(cu.cuMemPoolCreate != NULL);
}

/* CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE=1: cuStreamGetDevice works on a
 * capturing stream and the capture survives. */
static void child_get_device_in_capture(void)
{
    CUcontext c = NULL;
    CUstream s = NULL;
    CUdevice dev = -1;
    CUgraph g = NULL;
    CHILD_EXPECT(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuCtxPushCurrent(c) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuStreamGetDevice(s, &dev) == CUDA_SUCCESS && dev == 0);
    CHILD_EXPECT(cu.cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g != NULL);
}

/* CUDA_STANDIN_VMM_RDMA=0: the device reports no GPUDirect RDMA with VMM. */
static void child_no_vmm_rdma(void)
{
    int v = -1;
    CHILD_EXPECT(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_EXPECT(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 0) ==
                 CUDA_SUCCESS);
    CHILD_EXPECT(v == 0);
}

static const struct {
    const char *name;
    void (*body)(void);
} children[] = {
    {"get_device_in_capture", child_get_device_in_capture}, {"no_vmm_rdma", child_no_vmm_rdma},
    {"before_init", child_before_init},   {"visible_2_0", child_visible_2_0}, {"visible_1_7_0", child_visible_1_7_0},
    {"no_device", child_no_device},       {"memory_64m", child_memory_64m},   {"bad_memory", child_bad_memory},
    {"driver_12000", child_driver_12000},
};

static int child_main(const char *name)
{
    if (cu_load() != 0)
        return 200;
    for (size_t i = 0; i < sizeof children / sizeof children[0]; i++) {
        if (strcmp(children[i].name, name) == 0) {
            children[i].body();
            return 0;
        }
    }
    return 201;
}

static void test_configuration_from_environment(void **state)
{
    CU_NEED_STANDIN();
    const char *base[] = {"CUDA_STANDIN_DEVICES", "CUDA_STANDIN_MEMORY", "CUDA_STANDIN_DRIVER_VERSION", NULL};
    assert_int_equal(run_child("before_init", base), 0);
    const char *vis[] = {"CUDA_STANDIN_DEVICES=4", "CUDA_VISIBLE_DEVICES=2,0", NULL};
    assert_int_equal(run_child("visible_2_0", vis), 0);
    const char *vis_bad[] = {"CUDA_STANDIN_DEVICES=2", "CUDA_VISIBLE_DEVICES=1,7,0", NULL};
    assert_int_equal(run_child("visible_1_7_0", vis_bad), 0);
    const char *vis_twice[] = {"CUDA_STANDIN_DEVICES=2", "CUDA_VISIBLE_DEVICES=1,1", NULL};
    assert_int_equal(run_child("visible_1_7_0", vis_twice), 0);
    const char *none[] = {"CUDA_VISIBLE_DEVICES=", NULL};
    assert_int_equal(run_child("no_device", none), 0);
    const char *none2[] = {"CUDA_VISIBLE_DEVICES=5", NULL};
    assert_int_equal(run_child("no_device", none2), 0);
    const char *mem[] = {"CUDA_STANDIN_DEVICES=1", "CUDA_STANDIN_MEMORY=64M", NULL};
    assert_int_equal(run_child("memory_64m", mem), 0);
    const char *bad[] = {"CUDA_STANDIN_MEMORY=lots", NULL};
    assert_int_equal(run_child("bad_memory", bad), 0);
    const char *old[] = {"CUDA_STANDIN_DRIVER_VERSION=12000", NULL};
    assert_int_equal(run_child("driver_12000", old), 0);
    const char *get_device[] = {"CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE=1", NULL};
    assert_int_equal(run_child("get_device_in_capture", get_device), 0);
    const char *get_device_bad[] = {"CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE=yes", NULL};
    assert_int_equal(run_child("bad_memory", get_device_bad), 0); /* cuInit refuses */
    const char *no_rdma[] = {"CUDA_STANDIN_VMM_RDMA=0", NULL};
    assert_int_equal(run_child("no_vmm_rdma", no_rdma), 0);
}

/* ---- cuGetProcAddress ---------------------------------------------------------- */
static void test_proc_address_versions(void **state)
{
    CU_NEED_DRIVER();
    tally_pfn_cuGetProcAddress_v2 gpa2 = NULL;
    tally_pfn_cuGetProcAddress gpa = NULL;
    cu_proc_address_fns(cu_lib, &gpa2, &gpa);
    assert_non_null(gpa2);
    assert_non_null(gpa);
    void *pfn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    /* The plain name at the declared version: the versioned export. */
    CU_OK(gpa2("cuMemAlloc", &pfn, 3020, 0, &st));
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    assert_ptr_equal(pfn, dlsym(cu_lib, "cuMemAlloc_v2"));
    pfn = NULL;
    CU_OK(gpa("cuStreamBeginCapture", &pfn, 10010, 0));
    assert_ptr_equal(pfn, dlsym(cu_lib, "cuStreamBeginCapture_v2"));
    /* One name, two forms: the version asked for picks (cuStreamGetCtx 9.2 and 12.5). */
    if (cu_driver_version >= TALLY_CU_STREAM_GET_CTX_V2) {
        CU_OK(gpa2("cuStreamGetCtx", &pfn, 9020, 0, &st));
        assert_ptr_equal(pfn, dlsym(cu_lib, "cuStreamGetCtx"));
        CU_OK(gpa2("cuStreamGetCtx", &pfn, TALLY_CU_STREAM_GET_CTX_V2, 0, &st));
        assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
        assert_ptr_equal(pfn, dlsym(cu_lib, "cuStreamGetCtx_v2"));
        tally_pfn_cuStreamGetCtx_v2 get_ctx_v2 = NULL;
        memcpy(&get_ctx_v2, &pfn, sizeof pfn);
        CUcontext c = NULL, mine = NULL;
        CUgreenCtx green = (CUgreenCtx)&c;
        CUstream s = NULL;
        CU_OK(cu.cuDevicePrimaryCtxRetain(&mine, 0));
        CU_OK(cu.cuCtxPushCurrent(mine));
        CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_OK(get_ctx_v2(s, &c, &green));
        assert_ptr_equal(c, mine);
        assert_null(green); /* a regular context's stream */
        CU_OK(cu.cuStreamDestroy(s));
        CU_OK(cu.cuCtxPopCurrent(NULL));
        CU_OK(cu.cuDevicePrimaryCtxRelease(0));
    }
    /* Unknown symbol: found nothing. */
    pfn = &st;
    CUresult rc = gpa2("cuNoSuchEntryPoint", &pfn, 3020, 0, &st);
    if (cu_is_standin())
        CU_OK(rc); /* as documented: CUDA_SUCCESS, a NULL pointer, the status */
    else if (rc != CUDA_SUCCESS)
        print_message("note: this driver returns %s for an unknown symbol; the documentation says CUDA_SUCCESS\n",
                      cu_err_name(rc));
    assert_null(pfn);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* A version above the driver's. */
    CU_IS(gpa2("cuMemAlloc", &pfn, cu_driver_version + 10, 0, &st), CUDA_ERROR_INVALID_VALUE);
    if (cu_is_standin()) {
        /* Below the declared version: the stand-in has no older ABI. */
        pfn = &st;
        CU_OK(gpa2("cuMemPoolCreate", &pfn, 11000, 0, &st));
        assert_null(pfn);
        assert_int_equal(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        /* The names the real libcuda.so.1 exports. */
        const char *names[] = {"cuMemAlloc_v2",      "cuMemFree_v2",           "cuMemGetInfo_v2",
                               "cuDeviceTotalMem_v2", "cuCtxPushCurrent_v2",   "cuCtxPopCurrent_v2",
                               "cuStreamDestroy_v2", "cuEventDestroy_v2",      "cuDevicePrimaryCtxRelease_v2",
                               "cuStreamBeginCapture_v2", "cuInit",         "cuMemFreeAsync"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!dlsym(cu_lib, names[i]))
                fail_msg("libcuda.so.1 does not export %s", names[i]);
    }
    /* cu_load found every entry point this driver is new enough for. */
#define CHECK_LOADED(name, version, required, params)                                                              \
    if ((version) <= cu_driver_version && !cu.name)                                                                \
        fail_msg("cuGetProcAddress did not find %s", #name);
    TALLY_CU_ENTRY_POINTS(CHECK_LOADED)
#undef CHECK_LOADED
}

static void test_error_names(void **state)
{
    CU_NEED_DRIVER();
    /* Every CUresult lib/backend/cuda/driver.h declares. */
    const CUresult codes[] = {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
                              CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_STUB_LIBRARY,
                              CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_CONTEXT,
                              CUDA_ERROR_ALREADY_MAPPED, CUDA_ERROR_NOT_MAPPED, CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
                              CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_ILLEGAL_STATE,
                              CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY, CUDA_ERROR_ILLEGAL_ADDRESS,
                              CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
                              CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, CUDA_ERROR_CONTEXT_IS_DESTROYED,
                              CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_SUPPORTED,
                              CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                              CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                              CUDA_ERROR_CAPTURED_EVENT, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                              CUDA_ERROR_UNKNOWN};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *name = NULL, *text = NULL;
        CU_OK(cu.cuGetErrorName(codes[i], &name));
        CU_OK(cu.cuGetErrorString(codes[i], &text));
        assert_non_null(name);
        assert_non_null(text);
        assert_true(strncmp(name, "CUDA_", 5) == 0);
    }
    const char *name = NULL;
    CU_OK(cu.cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name));
    assert_string_equal(name, "CUDA_ERROR_OUT_OF_MEMORY");
    name = "x";
    CU_IS(cu.cuGetErrorName((CUresult)12345, &name), CUDA_ERROR_INVALID_VALUE);
    assert_null(name);
}

/* ---- contexts ---------------------------------------------------------------------- */
/* No fixture: starts with no context retained by this test program. */
static void test_primary_context_lifetime(void **state)
{
    CU_NEED_DRIVER();
    CUdevice dev = cu_ndev - 1;
    CUcontext c = NULL, cur = NULL, again = NULL;
    assert_int_equal(cu_ctx_active(dev), 0);
    CU_OK(cu.cuDevicePrimaryCtxRetain(&c, dev));
    assert_int_equal(cu_ctx_active(dev), 1);
    CU_OK(cu.cuCtxGetCurrent(&cur));
    assert_null(cur); /* retaining does not push */
    CU_OK(cu.cuDevicePrimaryCtxRetain(&again, dev));
    assert_ptr_equal(again, c);
    CU_OK(cu.cuDevicePrimaryCtxRelease(dev));
    assert_int_equal(cu_ctx_active(dev), 1); /* still one reference */
    if (cu_is_standin()) {
        /* An active context costs device memory. */
        size_t free_b = 0, total = 0;
        CU_OK(cu.cuCtxPushCurrent(c));
        CU_OK(cu.cuMemGetInfo(&free_b, &total));
        assert_int_equal(total - free_b, 256 * MiB);
        CU_OK(cu.cuCtxPopCurrent(&cur));
    }
    CU_OK(cu.cuDevicePrimaryCtxRelease(dev));
    assert_int_equal(cu_ctx_active(dev), 0);
    CU_IS(cu.cuDevicePrimaryCtxRelease(dev), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuDevicePrimaryCtxRetain(&c, cu_ndev), CUDA_ERROR_INVALID_DEVICE);
}

struct thread_probe {
    CUcontext seen;
    CUresult alloc_rc;
    CUresult result;
};

static void *probe_current(void *arg)
{
    struct thread_probe *p = arg;
    CUdeviceptr d = 0;
    p->result = cu.cuCtxGetCurrent(&p->seen);
    p->alloc_rc = cu.cuMemAlloc(&d, 4096);
    return NULL;
}

static void test_context_stack(void **state)
{
    CU_NEED_TWO();
    CUcontext cur = cu_ctx[0];
    CUdevice dev = -1;
    CUdeviceptr p = 0;
    size_t f = 0, t = 0;
    CUstream s = NULL;
    CUevent e = NULL;
    CU_OK(cu.cuCtxGetCurrent(&cur));
    assert_null(cur);
    /* Calls that need a current context. */
    CU_IS(cu.cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuMemGetInfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuStreamGetCtx(NULL, &cur), CUDA_ERROR_INVALID_CONTEXT);
    CU_IS(cu.cuCtxPopCurrent(&cur), CUDA_ERROR_INVALID_CONTEXT);
    /* Push, push, pop. */
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[1]));
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, 1);
    CU_OK(cu.cuCtxPopCurrent(&cur));
    assert_ptr_equal(cur, cu_ctx[1]);
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, 0);
    /* SetCurrent replaces the top. */
    CU_OK(cu.cuCtxSetCurrent(cu_ctx[1]));
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, 1);
    CU_OK(cu.cuStreamGetCtx(CU_STREAM_PER_THREAD, &cur));
    assert_ptr_equal(cur, cu_ctx[1]);
    /* The stack is per thread. */
    struct thread_probe probe = {.seen = cu_ctx[0]};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, probe_current, &probe), 0);
    pthread_join(th, NULL);
    CU_OK(probe.result);
    assert_null(probe.seen);
    CU_IS(probe.alloc_rc, CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cu.cuCtxPopCurrent(&cur));
    CU_OK(cu.cuCtxGetCurrent(&cur));
    assert_null(cur);
}

/* ---- memory --------------------------------------------------------------------------- */
static void test_memory_alloc_free_oom(void **state)
{
    CU_NEED_TWO();
    CUdeviceptr a = 0, b = 0, big = 0;
    size_t free0 = 0, free1 = 0, total = 0;
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[1]));
    CU_OK(cu.cuMemAlloc(&b, 1 * MiB));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_OK(cu.cuCtxPushCurrent(cu_ctx[0]));
    CU_IS(cu.cuMemAlloc(&a, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemGetInfo(&free0, &total));
    CU_OK(cu.cuMemAlloc(&a, 3 * MiB));
    assert_true(a != b);
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin()) {
        assert_int_equal(free0 - free1, 3 * MiB);
        memset((void *)(uintptr_t)a, 0xab, 3 * MiB); /* host memory: tests may touch it */
    }
    /* More than is free: out of memory. */
    CU_IS(cu.cuMemAlloc(&big, free1 + 1024 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cu.cuMemFree(a));
    CU_IS(cu.cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
    CU_IS(cu.cuMemFree(a + 512), CUDA_ERROR_INVALID_VALUE);
    /* Device 1's memory freed while device 0's context is current. */
    CU_OK(cu.cuMemFree(b));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    assert_true(free1 == free0 || !cu_is_standin());
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_IS(cu.cuMemFree(b), CUDA_ERROR_INVALID_CONTEXT);
}

/* ---- fork ------------------------------------------------------------------------------------ */
static void test_forked_child_cannot_use_cuda(void **state)
{
    CU_NEED_DRIVER();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int n = 0;
        CUcontext c = NULL;
        int ok = cu.cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED &&
                 cu.cuInit(0) == CUDA_ERROR_NOT_INITIALIZED &&
                 cu.cuDevicePrimaryCtxRetain(&c, 0) == CUDA_ERROR_NOT_INITIALIZED;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    int n = 0;
    CU_OK(cu.cuDeviceGetCount(&n)); /* the parent goes on */
}

int main(int argc, char **argv)
{
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    self_path[len > 0 ? len : 0] = '\0';
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2]);
    cu_test_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_configuration_from_environment),
        cmocka_unit_test(test_proc_address_versions),
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_primary_context_lifetime),
        cmocka_unit_test_setup_teardown(test_context_stack, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test_setup_teardown(test_memory_alloc_free_oom, cu_ctx_setup, cu_ctx_teardown),
        cmocka_unit_test(test_forked_child_cannot_use_cuda),
    };
    return cmocka_run_group_tests_name("standin", tests, NULL, NULL);
}
