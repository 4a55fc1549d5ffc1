/* The PyTorch pluggable-allocator entry points, reached the way PyTorch
 * reaches them: libtally.so opened with dlopen(RTLD_NOW | RTLD_LOCAL), the
 * functions found with dlsym by name and called with (size, device, stream).
 * Nothing here links against libtally's symbols directly, so the test sees
 * exactly what the shared library exports. Runs on the host backend with two
 * simulated devices.
 *
 * The library is found through TALLY_LIB, else $BUILD/lib/libtally.so (set
 * by make test-c), else build/lib/libtally.so from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "skip.h"
#include "tally.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <time.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CAPACITY (256u << 20)

static void *lib;

/* The entry points PyTorch looks up, and the public API the test inspects
 * state with; each resolved by name from the shared library. */
static struct {
    void *(*alloc)(size_t, int, void *);
    void (*free)(void *, size_t, int, void *);
    void (*init)(int);
    void (*empty_cache)(void);
    void (*memory_fraction)(double, int);
    void (*record_stream)(void *, void *);
    int (*oom_raises)(void);
    void *(*malloc)(size_t, int, void *);
    int (*get_stats)(int, tally_stats_t *);
    int (*block_info)(const void *, tally_block_info_t *);
    void (*set_sink)(tally_write_fn, void *);
    int (*host_stream_hold)(void *, int);
    int (*check)(void);
    int (*device_count)(void);
    const char *(*last_error)(void);
    int (*configure)(const char *);
} t;

/* Diagnostics captured from the library's sink. */
static char captured[16384];
static size_t captured_len;

static void capture(void *arg, const char *text, size_t len)
{
    (void)arg;
    if (len > sizeof captured - 1 - captured_len)
        len = sizeof captured - 1 - captured_len;
    memcpy(captured + captured_len, text, len);
    captured_len += len;
    captured[captured_len] = 0;
}

static void capture_start(void)
{
    captured_len = 0;
    captured[0] = 0;
    t.set_sink(capture, NULL);
}

static void capture_stop(void)
{
    t.set_sink(NULL, NULL);
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static const char *library_path(char *buf, size_t len)
{
    const char *env = getenv("TALLY_LIB");
    if (env && *env)
        return env;
    const char *build = getenv("BUILD");
    snprintf(buf, len, "%s/lib/libtally.so", build && *build ? build : "build");
    return buf;
}

#define RESOLVE(field, name)                                                        \
    do {                                                                            \
        *(void **)&t.field = dlsym(lib, name);                                      \
        if (!t.field) {                                                             \
            fprintf(stderr, "test_torch_abi: %s not found: %s\n", name, dlerror()); \
            return -1;                                                              \
        }                                                                           \
    } while (0)

static int setup(void **state)
{
    (void)state;
    char buf[1024];
    /* As a user would: the configuration is in the environment before the
     * library is first used. */
    setenv("TALLY_CONF",
           "backend:host,host_devices:2,host_capacity:256MiB,leak_report:off,stage_report:false", 1);
    const char *path = library_path(buf, sizeof buf);
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "test_torch_abi: cannot open %s: %s\n", path, dlerror());
        return -1;
    }
    RESOLVE(alloc, "tally_torch_alloc");
    RESOLVE(free, "tally_torch_free");
    RESOLVE(init, "tally_torch_init");
    RESOLVE(empty_cache, "tally_torch_empty_cache");
    RESOLVE(memory_fraction, "tally_torch_memory_fraction");
    RESOLVE(record_stream, "tally_torch_record_stream");
    RESOLVE(oom_raises, "tally_torch_oom_raises");
    RESOLVE(malloc, "tally_malloc");
    RESOLVE(get_stats, "tally_get_stats");
    RESOLVE(block_info, "tally_block_info");
    RESOLVE(set_sink, "tally_set_sink");
    RESOLVE(host_stream_hold, "tally_host_stream_hold");
    RESOLVE(check, "tally_check");
    RESOLVE(device_count, "tally_device_count");
    RESOLVE(last_error, "tally_last_error");
    RESOLVE(configure, "tally_configure");
    return 0;
}

static tally_stats_t stats(int device)
{
    tally_stats_t s;
    assert_int_equal(t.get_stats(device, &s), 0);
    return s;
}

static void test_library_state(void **state)
{
    (void)state;
    assert_int_equal(t.device_count(), 2);
    /* Only tally_* names leave the library. */
    assert_null(dlsym(lib, "tally__torch_raise"));
    assert_null(dlsym(lib, "tally__g"));
}

static void test_size_zero_is_null(void **state)
{
    (void)state;
    tally_stats_t before = stats(0);
    assert_null(t.alloc(0, 0, NULL));
    assert_null(t.alloc(0, 1, (void *)0x10));
    tally_stats_t after = stats(0);
    assert_int_equal(after.allocation[TALLY_POOL_ALL].allocated, before.allocation[TALLY_POOL_ALL].allocated);
    t.free(NULL, 0, 0, NULL); /* ignored, as PyTorch may do */
}

static void test_alloc_free_moves_stats(void **state)
{
    (void)state;
    void *stream = (void *)0x1000;
    tally_stats_t before = stats(1);
    void *p = t.alloc(1000, 1, stream);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 512, 0);
    tally_block_info_t info;
    assert_int_equal(t.block_info(p, &info), 0);
    assert_int_equal(info.device, 1);
    assert_ptr_equal(info.stream, stream);
    assert_int_equal(info.requested_size, 1000);

    tally_stats_t mid = stats(1);
    assert_int_equal(mid.allocation[TALLY_POOL_ALL].current, before.allocation[TALLY_POOL_ALL].current + 1);
    assert_int_equal(mid.requested_bytes[TALLY_POOL_ALL].current,
                     before.requested_bytes[TALLY_POOL_ALL].current + 1000);
    assert_int_equal(mid.allocated_bytes[TALLY_POOL_SMALL].current,
                     before.allocated_bytes[TALLY_POOL_SMALL].current + 1024);

    t.free(p, 1000, 1, stream);
    tally_stats_t after = stats(1);
    assert_int_equal(after.allocation[TALLY_POOL_ALL].current, before.allocation[TALLY_POOL_ALL].current);
    assert_int_equal(after.allocation[TALLY_POOL_ALL].freed, before.allocation[TALLY_POOL_ALL].freed + 1);
    assert_int_equal(after.requested_bytes[TALLY_POOL_ALL].current, before.requested_bytes[TALLY_POOL_ALL].current);
    assert_int_not_equal(t.block_info(p, &info), 0);
    assert_int_equal(t.check(), 0);
}

/* PyTorch may pass a wrong size (one release line did) and free while
 * another device is current: tally frees by its record and says so once. */
static void test_free_trusts_the_record(void **state)
{
    (void)state;
    tally_stats_t before = stats(0);
    void *a = t.alloc(3000, 0, NULL);
    void *b = t.alloc(5000, 0, NULL);
    void *c = t.alloc(7000, 0, NULL);
    void *e = t.alloc(9000, 0, NULL), *f = t.alloc(11000, 0, NULL);
    void *g = t.alloc(2000, 0, NULL);
    assert_non_null(g);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(e);
    assert_non_null(f);

    /* Device 0's lock earns its bias (64 takes in a row by one thread,
     * lib/core/lock.c), so that g's free below goes through the fast path,
     * whose size check must send it to the slow path that reports it. */
    for (int i = 0; i < 256; i++)
        t.free(t.alloc(512, 0, NULL), 512, 0, NULL);
    capture_start();
    t.free(g, 2999, 0, NULL); /* wrong size, right device (the fast path's check) */
    t.free(a, 3001, 1, NULL); /* wrong size, wrong device */
    t.free(b, 1, 1, NULL);    /* wrong again: not reported a second time */
    t.free(c, 7000, 0, NULL); /* right */
    t.free(e, 9000, 7, NULL); /* a device past the last: looked for on every device */
    t.free(f, 11000, -3, NULL);
    capture_stop();

    assert_int_equal(count_of(captured, "PyTorch passed 2999 bytes for"), 1);
    assert_int_equal(count_of(captured, "PyTorch passed 3001 bytes"), 0);
    assert_int_equal(count_of(captured, "PyTorch passed device 1"), 1);
    assert_int_equal(count_of(captured, "tally_torch_free"), 2);
    tally_stats_t after = stats(0);
    assert_int_equal(after.allocation[TALLY_POOL_ALL].current, before.allocation[TALLY_POOL_ALL].current);
    assert_int_equal(after.requested_bytes[TALLY_POOL_ALL].current, before.requested_bytes[TALLY_POOL_ALL].current);
    assert_int_equal(stats(1).allocation[TALLY_POOL_ALL].current, 0);
    assert_int_equal(t.check(), 0);
}

/* Another thread's allocation and free on device 0. */
static void *other_thread_pair(void *arg)
{
    (void)arg;
    void *p = t.alloc(4096, 0, NULL);
    if (p)
        t.free(p, 4096, 0, NULL);
    return p;
}

/* Another thread's allocation and free on device 0 finish within 30 s:
 * the device lock is not left held by this thread (what names the step
 * that would have left it). */
static void expect_lock_not_left_held(const char *what)
{
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread_pair, NULL), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    void *got = NULL;
    int rc = pthread_timedjoin_np(th, &got, &until);
    if (rc)
        fail_msg("another thread's allocation on device 0 did not finish in 30 s (pthread_timedjoin_np: %d): "
                 "%s left the device lock held",
                 rc, what);
    assert_non_null(got);
    assert_int_equal(t.check(), 0);
}

/* Earn device 0's lock the calling thread's bias: 20000 takes, more than
 * a run of takes must be (lib/core/lock.c, 64 at first, four times that
 * after each bias revoked before it served 8192) and enough for the bias to
 * serve 8192 of them, so that the next revoke does not make the next bias
 * harder to earn. */
static void bias_device_0(void)
{
    for (int i = 0; i < 10000; i++)
        t.free(t.alloc(512, 0, NULL), 512, 0, NULL);
}

/* A free the fast path cannot finish (NULL, which PyTorch may pass, or a
 * pointer tally never handed out) lets go of the device lock it took by
 * bias before it goes down the slow path, which may take no lock at all:
 * another thread's allocation on that device then gets the lock, where a
 * lock left held would keep it waiting for good. */
static void test_missed_free_leaves_the_lock_free(void **state)
{
    (void)state;
    bias_device_0();
    t.free(NULL, 0, 0, NULL);
    expect_lock_not_left_held("the missed free");
}

/* The same for an allocation the small fast path cannot serve (a large
 * block: the cache's general path, under the lock taken by bias), and for
 * its free (the general free). */
static void test_general_alloc_and_free_leave_the_lock_free(void **state)
{
    (void)state;
    bias_device_0();
    void *p = t.alloc(3u << 20, 0, NULL);
    assert_non_null(p);
    expect_lock_not_left_held("an allocation on the general path");
    bias_device_0();
    t.free(p, 3u << 20, 0, NULL);
    expect_lock_not_left_held("a free on the general path");
}

/* The same for the fast paths themselves, each checked on its own: an
 * allocation the small fast path serves, with no free after it (a free
 * lets the lock go and would hide an allocation that did not), and then
 * its fast free. */
static void test_fast_alloc_and_free_leave_the_lock_free(void **state)
{
    (void)state;
    bias_device_0();
    void *p = t.alloc(512, 0, NULL);
    assert_non_null(p);
    expect_lock_not_left_held("an allocation on the small fast path");
    bias_device_0();
    void *q = t.alloc(512, 0, NULL);
    assert_non_null(q);
    t.free(p, 512, 0, NULL);
    expect_lock_not_left_held("a free on the small fast path");
    t.free(q, 512, 0, NULL);
}

static void test_bad_free_is_reported_not_fatal(void **state)
{
    (void)state;
    void *p = t.alloc(4096, 0, NULL);
    assert_non_null(p);
    t.free(p, 4096, 0, NULL);
    capture_start();
    t.free(p, 4096, 0, NULL);
    int x;
    t.free(&x, 4, 0, NULL);
    capture_stop();
    assert_non_null(strstr(captured, "double free"));
    assert_non_null(strstr(captured, "was not allocated by tally"));
    assert_int_equal(t.check(), 0);
}

static void test_empty_cache_hook_releases(void **state)
{
    (void)state;
    void *p = t.alloc(3u << 20, 0, NULL);
    void *q = t.alloc(100, 1, NULL);
    assert_non_null(p);
    assert_non_null(q);
    t.free(p, 3u << 20, 0, NULL);
    t.free(q, 100, 1, NULL);
    assert_true(stats(0).reserved_bytes[TALLY_POOL_ALL].current > 0);
    assert_true(stats(1).reserved_bytes[TALLY_POOL_ALL].current > 0);
    int64_t freed = stats(0).num_device_free;
    t.empty_cache(); /* torch.cuda.empty_cache(): every device */
    assert_int_equal(stats(0).reserved_bytes[TALLY_POOL_ALL].current, 0);
    assert_int_equal(stats(1).reserved_bytes[TALLY_POOL_ALL].current, 0);
    assert_true(stats(0).num_device_free > freed);
}

/* Tensor.record_stream: the block, freed, waits for the other stream. */
static void test_record_stream_hook(void **state)
{
    (void)state;
    void *s1 = (void *)0x2001, *s2 = (void *)0x2002;
    void *p = t.alloc(1u << 16, 0, s1);
    assert_non_null(p);
    t.record_stream(p, s2);
    assert_int_equal(t.host_stream_hold(s2, 1), 0);
    t.free(p, 1u << 16, 0, s1);
    tally_stats_t s = stats(0);
    /* Freed by the user, still active: waiting on s2's event. */
    assert_int_equal(s.active[TALLY_POOL_ALL].current, s.allocation[TALLY_POOL_ALL].current + 1);
    void *other = t.alloc(1u << 16, 0, s1);
    assert_non_null(other);
    assert_ptr_not_equal(other, p); /* not reused while the event is pending */
    assert_int_equal(t.host_stream_hold(s2, 0), 0);
    t.free(other, 1u << 16, 0, s1);
    t.empty_cache();
    s = stats(0);
    assert_int_equal(s.active[TALLY_POOL_ALL].current, s.allocation[TALLY_POOL_ALL].current);
    assert_int_equal(t.check(), 0);
    t.record_stream(NULL, s2); /* ignored */
}

static void test_memory_fraction_hook(void **state)
{
    (void)state;
    t.empty_cache();
    t.memory_fraction(0.01, 0); /* 2.56 MiB of 256 MiB */
    capture_start();
    void *p = t.malloc(8u << 20, 0, NULL);
    capture_stop();
    assert_null(p);
    assert_non_null(strstr(t.last_error(), "out of memory"));
    void *q = t.malloc(8u << 20, 1, NULL); /* device 1 is not limited */
    assert_non_null(q);
    t.free(q, 8u << 20, 1, NULL);
    t.memory_fraction(1.0, 0);
    p = t.malloc(8u << 20, 0, NULL);
    assert_non_null(p);
    t.free(p, 8u << 20, 0, NULL);
    capture_start();
    t.memory_fraction(1.5, 0); /* reported, not applied */
    capture_stop();
    assert_non_null(strstr(captured, "fraction"));
}

static void test_init_hook(void **state)
{
    (void)state;
    capture_start();
    t.init(2);
    t.init(8); /* the host backend simulates its own count: no complaint */
    capture_stop();
    assert_int_equal(captured_len, 0);
    assert_int_equal(t.device_count(), 2);
}

/* An allocation that cannot be served never returns a silent NULL to
 * PyTorch when lib/torch/torch_oom.cc is linked in: it throws. Built without it,
 * alloc returns NULL with the OOM message as the last error. */
static void test_out_of_memory(void **state)
{
    (void)state;
    size_t huge = (size_t)CAPACITY * 2;
    if (!t.oom_raises()) {
        capture_start();
        void *p = t.alloc(huge, 0, NULL);
        capture_stop();
        assert_null(p);
        assert_non_null(strstr(t.last_error(), "out of memory"));
        assert_non_null(strstr(captured, "who holds device 0"));
        return;
    }
    /* C cannot catch the exception: a child process shows it is thrown (the
     * C++ runtime reports the uncaught exception's text and aborts). */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        t.alloc(huge, 0, NULL);
        _exit(0);
    }
    close(fds[1]);
    char out[8192];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof out - 1 && (k = read(fds[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = 0;
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (strstr(out, "AddressSanitizer") && strstr(out, "__cxa_throw") && strstr(out, "tally__torch_raise")) {
        /* ASan's __cxa_throw interceptor cannot throw in a C program that
         * loads libstdc++ only through dlopen; reaching the throw is what
         * can be shown here. */
        assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        return;
    }
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_non_null(strstr(out, "CUDA out of memory. Tried to allocate 512.00 MiB on device 0"));
}

/* What exit does to the library: its ELF destructors (the exit report
 * among them). Returns how many ran, or -1 if they cannot be found. */
static int run_library_destructors(void)
{
    struct link_map *lm = NULL;
    if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return -1;
    uintptr_t array = 0;
    size_t bytes = 0;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_FINI_ARRAY)
            array = d->d_un.d_ptr;
        else if (d->d_tag == DT_FINI_ARRAYSZ)
            bytes = d->d_un.d_val;
    }
    if (!array || !bytes)
        return -1;
    if (array < lm->l_addr)
        array += lm->l_addr; /* glibc leaves this entry unrelocated */
    void (**fns)(void) = (void (**)(void))array;
    size_t n = bytes / sizeof *fns;
    for (size_t i = n; i-- > 0;) /* reverse order, as exit does */
        fns[i]();
    return (int)n;
}

/* Python frees tensors during interpreter teardown, after tally's exit
 * report may have run: those frees (and even allocations) must still work. */
static void test_after_exit_report(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        /* The child's own block: a forked child's leak report leaves out
         * what it inherited (lib/api/process.c). */
        void *kept = t.alloc(12345, 1, NULL);
        if (!kept)
            _exit(5);
        t.configure("leak_report:full");
        if (run_library_destructors() < 1)
            _exit(3);
        t.free(kept, 12345, 1, NULL);
        void *p = t.alloc(777, 0, NULL);
        t.free(p, 777, 0, NULL);
        tally_stats_t s;
        if (t.get_stats(1, &s) || s.allocation[TALLY_POOL_ALL].current != 0 || t.check())
            _exit(4);
        _exit(0);
    }
    close(fds[1]);
    char out[8192];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof out - 1 && (k = read(fds[0], out + n, sizeof out - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = 0;
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 3)
        SKIP("no DT_FINI_ARRAY found: cannot imitate exit here");
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_non_null(strstr(out, "still live at exit")); /* the report ran, naming the live block */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_state),
        cmocka_unit_test(test_size_zero_is_null),
        cmocka_unit_test(test_alloc_free_moves_stats),
        cmocka_unit_test(test_free_trusts_the_record),
        cmocka_unit_test(test_missed_free_leaves_the_lock_free),
        cmocka_unit_test(test_general_alloc_and_free_leave_the_lock_free),
        cmocka_unit_test(test_fast_alloc_and_free_leave_the_lock_free),
        cmocka_unit_test(test_bad_free_is_reported_not_fatal),
        cmocka_unit_test(test_empty_cache_hook_releases),
        cmocka_unit_test(test_record_stream_hook),
        cmocka_unit_test(test_memory_fraction_hook),
        cmocka_unit_test(test_init_hook),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_after_exit_report),
    };
    return cmocka_run_group_tests_name("torch_abi", tests, setup, NULL);
}
