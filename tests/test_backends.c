/* Backend selection when CUDA has no device for tally: backend:cuda and
 * backend:async fail at first use with one clear line naming the CUDA call
 * and error, and nothing crashes; auto picks the host backend and says why
 * once. Each case runs in a forked child (the backend is chosen once per
 * process) with CUDA_VISIBLE_DEVICES empty, so the driver (the stand-in
 * under `make test`, or a real one) reports no device: the same on every
 * machine. Without any driver, auto says "no libcuda.so.1" (checked in a
 * re-executed child whose library path has no driver). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "skip.h"
#include "tally.h"

typedef struct child {
    char err[4096];
    int status;
    int result; /* what the child wrote back: bit 0 init failed, bit 1 malloc NULL */
} child_t;

static char sink_buf[2048];
static size_t sink_len;

static void sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    if (sink_len + len < sizeof sink_buf) {
        memcpy(sink_buf + sink_len, text, len);
        sink_len += len;
        sink_buf[sink_len] = 0;
    }
}

/* In a child: tally_init and one tally_malloc under conf; write the
 * outcome and the diagnostics text to fd. */
static int child_body(const char *conf, int fd)
{
    setenv("TALLY_CONF", conf, 1);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    tally_set_sink(sink, NULL);
    int failed = tally_init() != 0;
    void *p = tally_malloc(1 << 20, 0, NULL);
    char line[4096];
    int n = snprintf(line, sizeof line, "%d|%s|%s", failed | (p == NULL) << 1, tally_backend_name(), sink_buf);
    if (write(fd, line, (size_t)n) < 0)
        return 3;
    tally_free(p);
    return 0;
}

static const char *self_path;

/* Run child_body in a child with conf; collect the diagnostics text and the
 * outcome. no_driver: the child is this program again, with a library path
 * that holds no driver. */
static void run_child(const char *conf, child_t *c, bool no_driver)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        if (!no_driver)
            _exit(child_body(conf, fds[1]));
        dup2(fds[1], 1);
        setenv("LD_LIBRARY_PATH", "/nonexistent", 1);
        execl(self_path, self_path, "--child", conf, (char *)NULL);
        _exit(3);
    }
    close(fds[1]);
    memset(c, 0, sizeof *c);
    size_t got = 0;
    ssize_t n;
    while ((n = read(fds[0], c->err + got, sizeof c->err - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    assert_int_equal(waitpid(pid, &c->status, 0), pid);
    c->result = atoi(c->err);
}

static void check_refused(const char *conf, const char *name)
{
    child_t c;
    run_child(conf, &c, false);
    assert_true(WIFEXITED(c.status));
    assert_int_equal(WEXITSTATUS(c.status), 0);
    /* init failed and the allocation returned NULL */
    assert_int_equal(c.result, 3);
    char want[64];
    snprintf(want, sizeof want, "tally: backend %s unusable: ", name);
    if (!strstr(c.err, want))
        fail_msg("expected '%s' in: %s", want, c.err);
    /* One line: the reason is printed once, not per call. */
    const char *first = strstr(c.err, want);
    assert_null(strstr(first + 1, want));
    /* It names the CUDA call and CUDA's name for the error. */
    if (!strstr(first, "cuInit: CUDA_ERROR_NO_DEVICE"))
        fail_msg("expected the CUDA call and error name in: %s", first);
}

static void test_cuda_without_gpu_fails_cleanly(void **state)
{
    (void)state;
    check_refused("backend:cuda", "cuda");
}

static void test_async_without_gpu_fails_cleanly(void **state)
{
    (void)state;
    check_refused("backend:async", "async");
}

static void test_pytorch_backend_names_are_accepted(void **state)
{
    (void)state;
    child_t c;
    run_child("backend:cudaMallocAsync", &c, false);
    assert_non_null(strstr(c.err, "backend async unusable"));
    run_child("backend:native", &c, false);
    assert_non_null(strstr(c.err, "backend cuda unusable"));
}

/* TALLY_CONF names device 5 of 2: initialisation fails with one line
 * naming the key, the number and the devices there are, and nothing is
 * handed out (at run time: test_core_config_errors.c). */
static void test_home_device_beyond_the_devices_fails_init(void **state)
{
    (void)state;
    child_t c;
    run_child("backend:host,host_devices:2,home_device:5,leak_report:off", &c, false);
    assert_int_equal(c.result, 3); /* tally_init failed and tally_malloc gave NULL */
    const char *diag = strchr(strchr(c.err, '|') + 1, '|') + 1;
    assert_string_equal(diag, "tally: config: home_device: 5 is not a device (2 devices: 0 to 1)\n");
}

static void test_auto_picks_host_and_says_why(void **state)
{
    (void)state;
    child_t c;
    run_child("backend:auto", &c, false);
    assert_int_equal(c.result, 0);
    assert_non_null(strstr(c.err, "|host|"));
    assert_non_null(strstr(c.err, "tally: backend auto: using host, simulated devices (cuInit: CUDA_ERROR_NO_DEVICE"));
}

/* Without any driver on the library path: host, and not a word about it
 * (what a machine without a GPU expects; the report names the backend). */
static void test_auto_without_driver(void **state)
{
    (void)state;
    child_t c;
    run_child("backend:auto", &c, true);
    assert_true(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    if (strstr(c.err, "|cuda|")) {
        SKIP("a CUDA driver is installed on the system library path");
    }
    assert_int_equal(c.result, 0);
    if (!strstr(c.err, "|host|") || strstr(c.err, "backend auto"))
        fail_msg("unexpected: %s", c.err);
}

static void test_host_backend_never_mentions_cuda(void **state)
{
    (void)state;
    child_t c;
    run_child("backend:host", &c, false);
    assert_int_equal(c.result, 0);
    assert_null(strstr(c.err, "backend auto"));
    assert_null(strstr(c.err, "unusable"));
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--child") == 0)
        return child_body(argv[2], 1);
    self_path = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_without_gpu_fails_cleanly),
        cmocka_unit_test(test_async_without_gpu_fails_cleanly),
        cmocka_unit_test(test_pytorch_backend_names_are_accepted),
        cmocka_unit_test(test_auto_picks_host_and_says_why),
        cmocka_unit_test(test_auto_without_driver),
        cmocka_unit_test(test_home_device_beyond_the_devices_fails_init),
        cmocka_unit_test(test_host_backend_never_mentions_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
