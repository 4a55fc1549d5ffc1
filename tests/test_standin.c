/* Tests of the CUDA stand-in (tests/standin/, build/standin/libcuda.so.1)
 * through the driver API, as tally's backends use it: loaded with dlopen,
 * entry points taken through cuGetProcAddress (tests/cudautil.h).
 *
 * Each test checks one documented rule the stand-in models (docs/standin.md).
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

static int ndev;             /* devices, 0 when the driver did not load */
static CUcontext ctx[2];     /* primary contexts of devices 0 and 1 (fixture) */

/* ---- fixtures ------------------------------------------------------------- */
static int need_driver(void)
{
    if (ndev == 0) {
        print_message("no CUDA driver: %s\n", cu_load_error[0] ? cu_load_error : "cuInit failed");
        return 0;
    }
    return 1;
}

/* Retain the primary contexts of devices 0 and 1 (1 = 0 with one device). */
static int ctx_setup(void **state)
{
    if (ndev == 0)
        return 0;
    if (cu.cuDevicePrimaryCtxRetain(&ctx[0], 0) != CUDA_SUCCESS)
        return -1;
    ctx[1] = ctx[0];
    if (ndev > 1 && cu.cuDevicePrimaryCtxRetain(&ctx[1], 1) != CUDA_SUCCESS)
        return -1;
    return 0;
}

static int ctx_teardown(void **state)
{
    if (ndev == 0)
        return 0;
    CUcontext c = NULL;
    while (cu.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c)
        cu.cuCtxPopCurrent(&c);
    cu.cuDevicePrimaryCtxRelease(0);
    if (ndev > 1)
        cu.cuDevicePrimaryCtxRelease(1);
    return 0;
}

#define NEED_DRIVER()                                                                                              \
    do {                                                                                                           \
        if (!need_driver())                                                                                        \
            skip();                                                                                                \
    } while (0)
#define NEED_TWO()                                                                                                 \
    do {                                                                                                           \
        NEED_DRIVER();                                                                                             \
        if (ndev < 2)                                                                                              \
            skip();                                                                                                \
    } while (0)
#define NEED_STANDIN()                                                                                             \
    do {                                                                                                           \
        NEED_DRIVER();                                                                                             \
        if (!cu_is_standin())                                                                                      \
            skip();                                                                                                \
    } while (0)

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
    CHILD_EXPECT(cu.cuMemPoolCreate != NULL);
}

static const struct {
    const char *name;
    void (*body)(void);
} children[] = {
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
    NEED_STANDIN();
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
}

/* ---- cuGetProcAddress ---------------------------------------------------------- */
static void test_proc_address_versions(void **state)
{
    NEED_DRIVER();
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
    NEED_DRIVER();
    const CUresult codes[] = {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
                              CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE,
                              CUDA_ERROR_NOT_READY, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
                              CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                              CUDA_ERROR_CAPTURED_EVENT, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_UNKNOWN};
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
    NEED_DRIVER();
    CUdevice dev = ndev - 1;
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
    CU_IS(cu.cuDevicePrimaryCtxRetain(&c, ndev), CUDA_ERROR_INVALID_DEVICE);
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
    NEED_TWO();
    CUcontext cur = ctx[0];
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
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
    CU_OK(cu.cuCtxPushCurrent(ctx[1]));
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, 1);
    CU_OK(cu.cuCtxPopCurrent(&cur));
    assert_ptr_equal(cur, ctx[1]);
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, 0);
    /* SetCurrent replaces the top. */
    CU_OK(cu.cuCtxSetCurrent(ctx[1]));
    CU_OK(cu.cuCtxGetDevice(&dev));
    assert_int_equal(dev, 1);
    CU_OK(cu.cuStreamGetCtx(CU_STREAM_PER_THREAD, &cur));
    assert_ptr_equal(cur, ctx[1]);
    /* The stack is per thread. */
    struct thread_probe probe = {.seen = ctx[0]};
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
    NEED_TWO();
    CUdeviceptr a = 0, b = 0, big = 0;
    size_t free0 = 0, free1 = 0, total = 0;
    CU_OK(cu.cuCtxPushCurrent(ctx[1]));
    CU_OK(cu.cuMemAlloc(&b, 1 * MiB));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
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

/* ---- streams and events ------------------------------------------------------------------ */
static void set_flag(void *arg)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_SEQ_CST);
}

struct delayed {
    struct cu_hold *hold;
    useconds_t us;
};

static void *release_later(void *arg)
{
    struct delayed *d = arg;
    usleep(d->us);
    cu_release(d->hold);
    return NULL;
}

static void test_stream_hold_query_sync(void **state)
{
    NEED_DRIVER();
    CUstream s = NULL;
    CUevent done = NULL, never = NULL;
    CUcontext owner = NULL;
    int flag = 0;
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuEventCreate(&never, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuStreamGetCtx(s, &owner));
    assert_ptr_equal(owner, ctx[0]);
    CU_OK(cu.cuStreamGetCtx(NULL, &owner)); /* legacy: the current context's */
    assert_ptr_equal(owner, ctx[0]);
    CU_OK(cu.cuStreamQuery(s));
    CU_OK(cu.cuEventQuery(never)); /* never recorded: complete */
    struct cu_hold *h = cu_hold(s);
    assert_non_null(h);
    CU_OK(cu.cuLaunchHostFunc(s, set_flag, &flag));
    CU_OK(cu.cuEventRecord(done, s));
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CU_IS(cu.cuEventQuery(done), CUDA_ERROR_NOT_READY);
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 0);
    cu_release(h);
    CU_OK(cu.cuEventSynchronize(done));
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 1);
    CU_OK(cu.cuStreamSynchronize(s));
    CU_OK(cu.cuStreamQuery(s));
    /* cuCtxSynchronize waits for every stream of the context. */
    struct delayed d = {.hold = cu_hold(s), .us = 50000};
    assert_non_null(d.hold);
    CU_OK(cu.cuEventRecord(done, s));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_later, &d), 0);
    CU_OK(cu.cuCtxSynchronize());
    CU_OK(cu.cuEventQuery(done));
    pthread_join(th, NULL);
    CU_OK(cu.cuEventDestroy(done));
    CU_OK(cu.cuEventDestroy(never));
    CU_OK(cu.cuStreamDestroy(s));
    CU_IS(cu.cuStreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

static void test_events_cross_context(void **state)
{
    NEED_TWO();
    CUstream s0 = NULL, s1 = NULL;
    CUevent e0 = NULL, e1 = NULL;
    CUdevice dev = -1;
    CU_OK(cu.cuCtxPushCurrent(ctx[1]));
    CU_OK(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
    CU_OK(cu.cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING));
    if (cu.cuStreamGetDevice) {
        CU_OK(cu.cuStreamGetDevice(s1, &dev));
        assert_int_equal(dev, 1);
    }
    /* cuEventRecord: event and stream of different contexts. */
    CU_IS(cu.cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
    CU_IS(cu.cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
    /* cuStreamWaitEvent: an event of another device is fine, and waited for. */
    struct cu_hold *h = cu_hold(s1);
    assert_non_null(h);
    CU_OK(cu.cuEventRecord(e1, s1));
    CU_OK(cu.cuStreamWaitEvent(s0, e1, 0));
    CU_OK(cu.cuEventRecord(e0, s0));
    usleep(20000);
    CU_IS(cu.cuEventQuery(e0), CUDA_ERROR_NOT_READY);
    cu_release(h);
    CU_OK(cu.cuEventSynchronize(e0));
    CU_OK(cu.cuEventQuery(e1));
    CU_OK(cu.cuStreamDestroy(s0));
    CU_OK(cu.cuEventDestroy(e0));
    CU_OK(cu.cuCtxPopCurrent(NULL));
    CU_OK(cu.cuStreamDestroy(s1));
    CU_OK(cu.cuEventDestroy(e1));
}

/* ---- capture ------------------------------------------------------------------------------ */
static CUstreamCaptureStatus capture_status(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU_OK(cu.cuStreamIsCapturing(s, &st));
    return st;
}

/* End a capture expected to be invalidated. */
static void end_invalidated(CUstream s)
{
    CUgraph g = (CUgraph)&g;
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CU_IS(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_null(g);
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_NONE);
}

struct alloc_probe {
    CUcontext ctx;
    CUstreamCaptureMode mode;
    CUresult rc;
};

static void *alloc_in_thread(void *arg)
{
    struct alloc_probe *p = arg;
    CUdeviceptr d = 0;
    CUstreamCaptureMode m = p->mode;
    cu.cuCtxPushCurrent(p->ctx);
    cu.cuThreadExchangeStreamCaptureMode(&m);
    p->rc = cu.cuMemAlloc(&d, 4096);
    if (p->rc == CUDA_SUCCESS)
        cu.cuMemFree(d);
    cu.cuThreadExchangeStreamCaptureMode(&m);
    cu.cuCtxPopCurrent(NULL);
    return NULL;
}

static CUresult alloc_from_other_thread(CUstreamCaptureMode mode)
{
    struct alloc_probe p = {.ctx = ctx[0], .mode = mode, .rc = CUDA_ERROR_UNKNOWN};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, alloc_in_thread, &p), 0);
    pthread_join(th, NULL);
    return p.rc;
}

struct end_probe {
    CUstream stream;
    CUresult rc;
};

static void *end_in_thread(void *arg)
{
    struct end_probe *p = arg;
    CUgraph g = NULL;
    p->rc = cu.cuStreamEndCapture(p->stream, &g);
    return NULL;
}

static void test_capture_rules(void **state)
{
    NEED_DRIVER();
    CUstream s = NULL;
    CUevent e = NULL;
    CUgraph g = NULL;
    CUdeviceptr d = 0;
    int flag = 0;
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
    CU_OK(cu.cuStreamCreate(&s, CU_STREAM_DEFAULT));
    CU_OK(cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    assert_true(cu.cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS);

    /* 1. cuMemAlloc in the global mode during a capture: refused, capture invalidated. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_IS(cu.cuMemAlloc(&d, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated(s);

    /* 2. Captured work is not executed; a relaxed thread may allocate. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuLaunchHostFunc(s, set_flag, &flag));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_OK(cu.cuThreadExchangeStreamCaptureMode(&m));
    assert_int_equal(m, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CU_OK(cu.cuMemAlloc(&d, 4096));
    CU_OK(cu.cuMemFree(d));
    CU_OK(cu.cuThreadExchangeStreamCaptureMode(&m));
    assert_int_equal(m, CU_STREAM_CAPTURE_MODE_RELAXED);
    /* Another thread in the global mode is refused by a global capture. */
    CU_IS(alloc_from_other_thread(CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated(s);
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 0);

    /* 3. A thread-local capture ignores other threads; ends with a graph. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CU_OK(alloc_from_other_thread(CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_OK(cu.cuLaunchHostFunc(s, set_flag, &flag));
    CU_OK(cu.cuStreamEndCapture(s, &g));
    assert_non_null(g);
    CU_OK(cu.cuGraphDestroy(g));
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 0);

    /* 4. Querying an event recorded in the capture is illegal and invalidates it. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_OK(cu.cuEventRecord(e, s));
    CUresult rc = cu.cuEventQuery(e);
    assert_true(rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY);
    if (cu_is_standin())
        CU_IS(rc, CUDA_ERROR_CAPTURED_EVENT);
    end_invalidated(s);

    /* 5. Querying or synchronising the capturing stream, likewise. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_IS(cu.cuStreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated(s);
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_IS(cu.cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated(s);

    /* 6. The legacy stream while a blocking stream captures. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUstreamCaptureStatus st;
    CU_IS(cu.cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cu.cuStreamEndCapture(s, &g));
    CU_OK(cu.cuGraphDestroy(g));

    /* 7. No second capture on a capturing stream; a global capture ends on
     * its own thread. */
    CU_OK(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    rc = cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    assert_true(rc != CUDA_SUCCESS);
    if (cu_is_standin())
        CU_IS(rc, CUDA_ERROR_ILLEGAL_STATE);
    struct end_probe ep = {.stream = s, .rc = CUDA_SUCCESS};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, end_in_thread, &ep), 0);
    pthread_join(th, NULL);
    CU_IS(ep.rc, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    assert_int_equal(capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CU_OK(cu.cuStreamEndCapture(s, &g));
    CU_OK(cu.cuGraphDestroy(g));
    CU_OK(cu.cuStreamSynchronize(s));
    assert_int_equal(__atomic_load_n(&flag, __ATOMIC_SEQ_CST), 0);
    CU_OK(cu.cuStreamDestroy(s));
    CU_OK(cu.cuEventDestroy(e));
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

/* ---- virtual memory ------------------------------------------------------------------------ */
static void test_virtual_memory(void **state)
{
    NEED_DRIVER();
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t gran = 0, free0 = 0, free1 = 0, total = 0;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    CU_OK(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    assert_true(gran >= 4096 && (gran & (gran - 1)) == 0);
    if (cu_is_standin())
        assert_int_equal(gran, 2 * MiB);
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
    CU_OK(cu.cuMemGetInfo(&free0, &total));
    CU_OK(cu.cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
    CU_IS(cu.cuMemCreate(&h, gran + gran / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuMemCreate(&h, 2 * gran, &prop, 0));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin())
        assert_int_equal(free0 - free1, 2 * gran);
    CU_OK(cu.cuMemMap(va, 2 * gran, 0, h, 0));
    assert_true(cu.cuMemMap(va + gran, 2 * gran, 0, h, 0) != CUDA_SUCCESS); /* already mapped */
    assert_true(cu.cuMemMap(va + 7 * gran, 2 * gran, 0, h, 0) != CUDA_SUCCESS); /* past the reservation */
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_OK(cu.cuMemSetAccess(va, 2 * gran, &acc, 1));
    assert_true(cu.cuMemSetAccess(va, 3 * gran, &acc, 1) != CUDA_SUCCESS); /* not all mapped */
    /* Released while mapped: the memory stays until unmapped. */
    CU_OK(cu.cuMemRelease(h));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin()) {
        assert_int_equal(free0 - free1, 2 * gran);
        assert_true(cu.cuMemUnmap(va, gran) != CUDA_SUCCESS); /* a sub-range */
    }
    CU_OK(cu.cuMemUnmap(va, 2 * gran));
    CU_OK(cu.cuMemGetInfo(&free1, &total));
    if (cu_is_standin())
        assert_int_equal(free1, free0);
    CU_OK(cu.cuMemAddressFree(va, 8 * gran));
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

/* ---- pools ---------------------------------------------------------------------------------- */
static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
    cuuint64_t v = 0;
    CU_OK(cu.cuMemPoolGetAttribute(pool, attr, &v));
    return v;
}

static void test_pool_stream_order_and_release(void **state)
{
    NEED_DRIVER();
    CUmemoryPool pool = NULL, again = NULL;
    CUstream a = NULL, b = NULL;
    CUdeviceptr p = 0, q = 0, r = 0;
    CUevent after = NULL;
    CU_OK(cu.cuCtxPushCurrent(ctx[0]));
    CU_OK(cu.cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
    CU_OK(cu.cuDeviceGetDefaultMemPool(&pool, 0));
    CU_OK(cu.cuDeviceGetDefaultMemPool(&again, 0));
    assert_ptr_equal(pool, again);
    CU_IS(cu.cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    cuuint64_t keep = UINT64_MAX;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CU_OK(cu.cuMemAllocFromPoolAsync(&p, 4 * MiB, pool, a));
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 4 * MiB);
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 4 * MiB);
    /* Without internal dependencies, a free not yet executed on `a` is not
     * reused by `b`. */
    int off = 0, on = 1;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
    struct cu_hold *h = cu_hold(a);
    assert_non_null(h);
    CU_OK(cu.cuMemFreeAsync(p, a));
    CU_OK(cu.cuMemAllocFromPoolAsync(&q, 4 * MiB, pool, b));
    assert_true(q != p);
    /* With them (the default), `b` may take it, but only after the free. */
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &on));
    CU_OK(cu.cuMemAllocFromPoolAsync(&r, 4 * MiB, pool, b));
    CU_OK(cu.cuEventRecord(after, b));
    if (cu_is_standin())
        assert_true(r == p);
    if (r == p) {
        usleep(20000);
        CU_IS(cu.cuEventQuery(after), CUDA_ERROR_NOT_READY);
    }
    cu_release(h);
    CU_OK(cu.cuEventSynchronize(after));
    CU_OK(cu.cuStreamSynchronize(a));
    CU_OK(cu.cuMemFreeAsync(q, b));
    CU_OK(cu.cuMemFreeAsync(r, b));
    CU_OK(cu.cuStreamSynchronize(b));
    /* Above threshold UINT64_MAX nothing is released; trimming releases. */
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 8 * MiB);
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
    CU_OK(cu.cuMemPoolTrimTo(pool, 0));
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
    /* Threshold 0: released at the next synchronisation. */
    keep = 0;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    CU_OK(cu.cuMemAllocFromPoolAsync(&p, 2 * MiB, pool, a));
    CU_OK(cu.cuMemFreeAsync(p, a));
    CU_OK(cu.cuStreamSynchronize(a));
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
    /* High watermarks: reset with 0, a non-zero value is refused. */
    assert_true(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 8 * MiB);
    cuuint64_t zero = 0, one = 1;
    CU_OK(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    assert_int_equal(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0);
    CU_IS(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &one), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.cuEventDestroy(after));
    CU_OK(cu.cuStreamDestroy(a));
    CU_OK(cu.cuStreamDestroy(b));
    CU_OK(cu.cuCtxPopCurrent(NULL));
}

static void test_pool_and_peer_access(void **state)
{
    NEED_TWO();
    CUmemoryPool pool = NULL, mine = NULL;
    CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemLocation peer = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 1};
    CUmemLocation own = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    int can = 0;
    CU_OK(cu.cuDeviceCanAccessPeer(&can, 0, 1));
    if (cu_is_standin())
        assert_int_equal(can, 1);
    CU_OK(cu.cuDeviceGetDefaultMemPool(&pool, 0));
    CU_OK(cu.cuMemPoolGetAccess(&flags, pool, &own));
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = own};
    CU_OK(cu.cuMemPoolCreate(&mine, &props));
    CU_OK(cu.cuMemPoolGetAccess(&flags, mine, &peer));
    assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE); /* not until granted */
    if (can) {
        /* Context peer access does not reach pools. */
        CU_OK(cu.cuCtxPushCurrent(ctx[1]));
        CU_OK(cu.cuCtxEnablePeerAccess(ctx[0], 0));
        CU_IS(cu.cuCtxEnablePeerAccess(ctx[0], 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        CU_IS(cu.cuCtxEnablePeerAccess(ctx[1], 0), CUDA_ERROR_INVALID_CONTEXT);
        CU_IS(cu.cuCtxEnablePeerAccess(ctx[0], 1), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cu.cuCtxPopCurrent(NULL));
        CU_OK(cu.cuMemPoolGetAccess(&flags, mine, &peer));
        assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
        CUmemAccessDesc grant = {.location = peer, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CU_OK(cu.cuMemPoolSetAccess(mine, &grant, 1));
        CU_OK(cu.cuMemPoolGetAccess(&flags, mine, &peer));
        assert_int_equal(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }
    CU_OK(cu.cuMemPoolDestroy(mine));
}

/* ---- fork ------------------------------------------------------------------------------------ */
static void test_forked_child_cannot_use_cuda(void **state)
{
    NEED_DRIVER();
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
    if (cu_load() == 0 && cu.cuInit(0) == CUDA_SUCCESS && cu.cuDeviceGetCount(&ndev) != CUDA_SUCCESS)
        ndev = 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_configuration_from_environment),
        cmocka_unit_test(test_proc_address_versions),
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_primary_context_lifetime),
        cmocka_unit_test_setup_teardown(test_context_stack, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_memory_alloc_free_oom, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_stream_hold_query_sync, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_events_cross_context, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_capture_rules, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_virtual_memory, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_pool_stream_order_and_release, ctx_setup, ctx_teardown),
        cmocka_unit_test_setup_teardown(test_pool_and_peer_access, ctx_setup, ctx_teardown),
        cmocka_unit_test(test_forked_child_cannot_use_cuda),
    };
    return cmocka_run_group_tests_name("standin", tests, NULL, NULL);
}
