/* The output layer every report is written through (lib/core/out.c): its
 * buffer, lines too long for it, JSON string escapes, a long line that finds
 * no memory, and the last-error text. */
#include "testutil.h"

#include "core/internal.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* buf[0..n-1] filled with c, NUL-terminated. */
static const char *filled(char *buf, size_t n, char c)
{
    memset(buf, c, n - 1);
    buf[n - 1] = 0;
    return buf;
}

static void write_all(const char *const *parts, int n, tu_buf_t *b)
{
    tally_out_t o;
    tally__out_init(&o, tu_buf_write, b);
    for (int i = 0; i < n; i++)
        tally__out_puts(&o, parts[i]);
    tally__out_flush(&o);
    assert_int_equal(o.failed, 0);
}

/* A text longer than the buffer goes straight to the writer, after what
 * was buffered and before what follows: the bytes arrive whole, in order. */
static void test_text_longer_than_the_buffer_arrives_whole_and_in_order(void **state)
{
    (void)state;
    static char big[3 * sizeof ((tally_out_t *)0)->buf];
    filled(big, sizeof big, 'b');
    const char *parts[] = {"head ", big, " tail"};
    tu_buf_t b = {0};
    write_all(parts, 3, &b);
    assert_int_equal(b.len, 5 + strlen(big) + 5);
    assert_memory_equal(b.p, "head ", 5);
    assert_memory_equal(b.p + 5, big, strlen(big));
    assert_string_equal(b.p + 5 + strlen(big), " tail");
    tu_buf_free(&b);
}

/* A formatted line longer than the 1 KiB scratch line is formatted again
 * into memory of its size: whole, nothing cut. */
static void test_formatted_line_longer_than_a_kib_is_whole(void **state)
{
    (void)state;
    char name[3000];
    filled(name, sizeof name, 'n');
    tu_buf_t b = {0};
    tally_out_t o;
    tally__out_init(&o, tu_buf_write, &b);
    tally__out_printf(&o, "<%s|%d>", name, 42);
    tally__out_flush(&o);
    assert_int_equal(o.failed, 0);
    assert_int_equal(b.len, strlen(name) + 5);
    assert_int_equal(b.p[0], '<');
    assert_memory_equal(b.p + 1, name, strlen(name));
    assert_string_equal(b.p + 1 + strlen(name), "|42>");
    tu_buf_free(&b);
}

/* No memory for that long line: the output is marked failed (the report
 * calls return -TALLY_ENOMEM from it) and nothing of the line is written;
 * short lines still go out. */
static void test_long_line_without_memory_marks_the_output_failed(void **state)
{
    (void)state;
    char name[2000];
    filled(name, sizeof name, 'n');
    tu_buf_t b = {0};
    tally_out_t o;
    tally__out_init(&o, tu_buf_write, &b);
    tally__meta_fail(1, 0);
    tally__out_printf(&o, "%s", name);
    uint64_t hits = tally__meta_fail_hits();
    tally__meta_fail(0, 0);
    assert_int_equal(hits, 1);
    assert_int_equal(o.failed, 1);
    tally__out_printf(&o, "short %d", 7);
    tally__out_flush(&o);
    assert_string_equal(b.p, "short 7");
    tu_buf_free(&b);
}

/* JSON strings: a quote and a backslash get a backslash, control
 * characters become \u00XX, everything else (UTF-8 included) as it is. */
static void test_json_string_escapes(void **state)
{
    (void)state;
    tu_buf_t b = {0};
    tally_out_t o;
    tally__out_init(&o, tu_buf_write, &b);
    tally__out_json_str(&o, "a\"b\\c\nd\x01\x1f\xc3\xa9/");
    tally__out_flush(&o);
    assert_string_equal(b.p, "\"a\\\"b\\\\c\\u000ad\\u0001\\u001f\xc3\xa9/\"");
    tu_buf_free(&b);
}

/* tally__clear_error empties what tally_last_error says. */
static void test_cleared_error_is_empty(void **state)
{
    (void)state;
    tu_buf_t sunk = {0};
    tally_set_sink(tu_buf_write, &sunk);
    assert_int_equal(tally__fail(TALLY_EINVAL, "something went wrong"), -TALLY_EINVAL);
    assert_string_equal(tally_last_error(), "something went wrong");
    assert_string_equal(sunk.p, "tally: something went wrong\n");
    tally__clear_error();
    assert_string_equal(tally_last_error(), "");
    tally_set_sink(NULL, NULL);
    tu_buf_free(&sunk);
}

/* The default sink writes to fd 2 and gives up when a write fails: with fd
 * 2 closed a diagnostic returns (a child, which an alarm ends if the sink
 * keeps trying). */
static void test_default_sink_returns_when_stderr_is_closed(void **state)
{
    (void)state;
    tally_set_sink(NULL, NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(10);
        close(2);
        tally__diag("a diagnostic with nowhere to go");
        tally__diag("and another");
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child did not return from the diagnostic (status %#x%s)", status,
                 WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? ": still writing after 10 s" : "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_longer_than_the_buffer_arrives_whole_and_in_order),
        cmocka_unit_test(test_formatted_line_longer_than_a_kib_is_whole),
        cmocka_unit_test(test_long_line_without_memory_marks_the_output_failed),
        cmocka_unit_test(test_json_string_escapes),
        cmocka_unit_test(test_cleared_error_is_empty),
        cmocka_unit_test(test_default_sink_returns_when_stderr_is_closed),
    };
    return cmocka_run_group_tests_name("out", tests, NULL, NULL);
}
