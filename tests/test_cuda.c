/* Tests of the cuda and async backends on a real GPU. Each runs in a forked
 * child with its backend forced through TALLY_CONF; without a CUDA device
 * (or in a build without CUDA) every test is reported as skipped. The GPU
 * script (bench/gpu/run_all.sh) runs these and the longer cuda_check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "skip.h"
#include "tally.h"

#ifdef TALLY_HAVE_CUDA
#include <cuda_runtime_api.h>

static int gpu_count(void)
{
    /* In a child: the parent must not initialise CUDA before forking. */
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess ? (n > 9 ? 9 : n) : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

static void CUDART_CB sleep_ms(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg * 1000);
}

/* Runs body in a child under conf; the child's exit status is the number of
 * failed expectations (or 100 + line of the first one). */
#define EXPECT(cond)                                                                                               \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "test_cuda: line %d: %s (%s)\n", __LINE__, #cond, tally_last_error());                 \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

static void in_child(const char *conf, void (*body)(void))
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("TALLY_CONF", conf, 1);
        body();
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void body_malloc_free(void)
{
    EXPECT(tally_init() == 0);
    cudaStream_t s;
    EXPECT(cudaStreamCreate(&s) == cudaSuccess);
    void *a = tally_malloc(3 << 20, 0, s);
    EXPECT(a != NULL);
    EXPECT(cudaMemsetAsync(a, 0, 3 << 20, s) == cudaSuccess);
    tally_free(a);
    void *b = tally_malloc(3 << 20, 0, s);
    if (strcmp(tally_backend_name(), "cuda") == 0)
        EXPECT(a == b); /* served from the cache */
    tally_free(b);
    EXPECT(tally_check() == 0);
    EXPECT(cudaStreamSynchronize(s) == cudaSuccess);
}

static void body_streams(void)
{
    cudaStream_t s1, s2;
    EXPECT(cudaStreamCreate(&s1) == cudaSuccess && cudaStreamCreate(&s2) == cudaSuccess);
    void *a = tally_malloc(1 << 20, 0, s1);
    tally_free(a);
    void *b = tally_malloc(1 << 20, 0, s2);
    EXPECT(b != a || strcmp(tally_backend_name(), "async") == 0);
    tally_free(b);
    /* record_stream while s2 is busy: not reused on s1 until s2 is done. */
    void *c = tally_malloc(1 << 20, 0, s1);
    EXPECT(cudaLaunchHostFunc(s2, sleep_ms, (void *)(uintptr_t)200) == cudaSuccess);
    EXPECT(tally_record_stream(c, s2) == 0);
    tally_free(c);
    if (strcmp(tally_backend_name(), "cuda") == 0) {
        void *d = tally_malloc(1 << 20, 0, s1);
        EXPECT(d != c);
        tally_free(d);
    }
    EXPECT(cudaDeviceSynchronize() == cudaSuccess);
    EXPECT(tally_check() == 0);
}

static void body_oom_and_release(void)
{
    size_t free_b = 0, total = 0;
    EXPECT(tally_mem_get_info(0, &free_b, &total) == 0);
    tally_stats_t before, after;
    tally_get_stats(0, &before);
    EXPECT(tally_malloc(total * 2, 0, NULL) == NULL);
    tally_get_stats(0, &after);
    EXPECT(after.num_ooms == before.num_ooms + 1);
    void *p = tally_malloc(256 << 20, 0, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(cudaDeviceSynchronize() == cudaSuccess);
    tally_get_stats(0, &before);
    tally_empty_cache(0);
    tally_get_stats(0, &after);
    EXPECT(after.reserved_bytes[0].current < before.reserved_bytes[0].current);
    EXPECT(tally_check() == 0);
}

/* Skips the calling test when no CUDA device is visible. */
#define NEED_GPU()                                                                                                 \
    do {                                                                                                           \
        static int n_ = -1;                                                                                        \
        if (n_ < 0)                                                                                                \
            n_ = gpu_count();                                                                                      \
        if (n_ == 0)                                                                                               \
            SKIP("no CUDA device is visible");                                                                     \
    } while (0)

static void test_cuda_malloc_free(void **state)
{
    (void)state;
    NEED_GPU();
    in_child("backend:cuda,leak_report:off", body_malloc_free);
}

static void test_cuda_streams_and_record_stream(void **state)
{
    (void)state;
    NEED_GPU();
    in_child("backend:cuda,leak_report:off", body_streams);
}

static void test_cuda_oom_and_empty_cache(void **state)
{
    (void)state;
    NEED_GPU();
    in_child("backend:cuda,leak_report:off", body_oom_and_release);
}

static void test_async_malloc_free(void **state)
{
    (void)state;
    NEED_GPU();
    in_child("backend:async,leak_report:off", body_malloc_free);
}

static void test_async_streams_and_record_stream(void **state)
{
    (void)state;
    NEED_GPU();
    in_child("backend:async,leak_report:off", body_streams);
}

static void test_async_oom_and_trim(void **state)
{
    (void)state;
    NEED_GPU();
    in_child("backend:async,leak_report:off", body_oom_and_release);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_malloc_free),
        cmocka_unit_test(test_cuda_streams_and_record_stream),
        cmocka_unit_test(test_cuda_oom_and_empty_cache),
        cmocka_unit_test(test_async_malloc_free),
        cmocka_unit_test(test_async_streams_and_record_stream),
        cmocka_unit_test(test_async_oom_and_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
static void test_cuda_backend(void **state)
{
    (void)state;
    NEED_GPU();
    SKIP("built without CUDA");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuda_backend)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
