/* Running a test body in a forked child against libcuda.so.1 (the CUDA
 * stand-in under `make test`, docs/standin.md; the real driver with
 * TALLY_REAL_CUDA=1): each body gets its own TALLY_CONF and a fresh CUDA
 * (which must not be initialised before a fork), and fails by exiting
 * non-zero. The stand-in gets three devices (CUDA_STANDIN_DEVICES, ignored by
 * a real driver). For tests/test_backend_cuda*.c (test_backend_cuda,
 * _events, _graph_pool, _refusals) and tests/test_api_relied_on.c.
 *
 *   EXPECT(cond), CU_EXPECT(call)  in a body: on failure, say where and exit 1
 *   in_child(conf, body)           run body in a child under TALLY_CONF=conf
 *   need_devices(n)                fail without a driver, skip with fewer than n
 *   driver_up()                    in a body: load the driver and cuInit
 *   make_stream(dev)               a non-blocking stream in dev's primary context
 *   is_cuda()                      in a body: the backend is cuda (not async)
 *   child_said_sink, child_said    a sink keeping what tally wrote (child_said_clear)
 *   CUDA_TEST(name, conf, body, n) a cmocka test: body in a child, n devices needed
 * Include after cmocka.h. */
#ifndef TALLY_TESTS_CUDACHILD_H
#define TALLY_TESTS_CUDACHILD_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudautil.h"
#include "orphan.h" /* tu_die_with_parent */
#include "skip.h"
#include "tally.h"

/* ---- running a body in a child --------------------------------------------- */

#define EXPECT(cond)                                                                                               \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "%s:%d: %s (tally: %s)\n", __FILE__, __LINE__, #cond, tally_last_error());          \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

#define CU_EXPECT(call)                                                                                            \
    do {                                                                                                           \
        CUresult r_ = (call);                                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                                  \
            fprintf(stderr, "%s:%d: %s returned %s\n", __FILE__, __LINE__, #call, cu_err_name(r_));             \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

static inline void child_env(const char *conf)
{
    setenv("CUDA_STANDIN_DEVICES", "3", 1);
    setenv("TALLY_CONF", conf, 1);
    alarm(60); /* a hang (a wait on a held stream) fails the test */
}

/* Runs body in a child under conf; it must exit 0. */
static inline void in_child(const char *conf, void (*body)(void))
{
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_die_with_parent(parent);
        child_env(conf);
        body();
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child for '%s' ended with status %d (signal %d)", conf, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* Devices the driver reports (in a child: the parent stays CUDA-free). */
static inline int driver_devices(void)
{
    static int n = -1;
    if (n >= 0)
        return n;
    pid_t pid = fork();
    if (pid == 0) {
        child_env("");
        int count = 0;
        if (cu_load() || cu.cuInit(0) != CUDA_SUCCESS || cu.cuDeviceGetCount(&count) != CUDA_SUCCESS)
            _exit(0);
        _exit(count > 9 ? 9 : count);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    n = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    return n;
}

/* The driver (stand-in or real) must be there: `make test` provides it. */
static inline void need_devices(int want)
{
    int n = driver_devices();
    if (n == 0)
        fail_msg("no CUDA driver: libcuda.so.1 (the stand-in, build/standin) must be on LD_LIBRARY_PATH");
    if (n < want) {
        SKIP("needs %d devices, the driver has %d", want, n);
    }
}

static inline void driver_up(void)
{
    if (cu_load() != 0) {
        fprintf(stderr, "%s: %s\n", __FILE__, cu_load_error);
        _exit(1);
    }
    CU_EXPECT(cu.cuInit(0));
}

/* A non-blocking stream of dev, created in dev's primary context (which the
 * test itself thereby retains). */
static inline CUstream make_stream(int dev)
{
    CUdevice d;
    CUcontext ctx, popped;
    CUstream s;
    CU_EXPECT(cu.cuDeviceGet(&d, dev));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&ctx, d));
    CU_EXPECT(cu.cuCtxPushCurrent(ctx));
    CU_EXPECT(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
    return s;
}

static inline bool is_cuda(void)
{
    return strcmp(tally_backend_name(), "cuda") == 0;
}

/* ---- what tally said ------------------------------------------------------------ */

static char child_said[8192];
static size_t child_said_len;

static inline void child_said_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    if (child_said_len + len < sizeof child_said) {
        memcpy(child_said + child_said_len, text, len);
        child_said_len += len;
        child_said[child_said_len] = 0;
    }
}

static inline void child_said_clear(void)
{
    child_said_len = 0;
    child_said[0] = 0;
}

#define CUDA_TEST(name, conf, body, devices)                                                                       \
    static void name(void **state)                                                                                 \
    {                                                                                                              \
        (void)state;                                                                                               \
        need_devices(devices);                                                                                     \
        in_child(conf, body);                                                                                      \
    }

#endif
