/* Bad input the other test files do not cover (docs/bad-input.md lists
 * each case and its test): sizes no device has, NULL outputs and bad
 * devices, record_stream and held-stream limits, stage nesting, the
 * reserved names, report paths (and planted links at the temporary file),
 * configuration strings, names that are not UTF-8, and the printed
 * configuration parsed back. */
#include <dirent.h>
#include "testutil.h"
#include "core/internal.h" /* tally__options_parse, for the known-bug test */

#include <sys/stat.h>
#include <unistd.h>

/* Sizes that are not negative but no device has: an OOM each, counted
 * and reported once, nothing else changes (no overflow in the rounding). */
static void test_bad_input_huge_sizes_are_out_of_memory(void **state)
{
    (void)state;
    static const size_t sizes[] = {(size_t)INT64_MAX, (size_t)1 << 62, (size_t)1 << 40, 80 * GiB + 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        tally_stats_t a = tu_stats(1);
        cap_begin();
        assert_null(tally_malloc(sizes[i], 1, NULL));
        cap_end();
        tally_stats_t b = tu_stats(1);
        tu_ctx("size %zu", sizes[i]);
        EQ(b.num_ooms, a.num_ooms + 1);
        EQ(b.reserved_bytes[0].current, a.reserved_bytes[0].current);
        EQ(b.allocation[0].current, a.allocation[0].current);
        HAS(tally_last_error(), "out of memory on device 1");
        char want[96];
        snprintf(want, sizeof want, "tally: out of memory on device 1: asked %zu bytes", sizes[i]);
        HAS(cap_text(), want);
    }
    tu_ctx("%s", "");
    CHECK_OK();
}

/* NULL where a result must go, and bad devices in the calls test_api.c
 * does not try: refused with -TALLY_EINVAL and one line each. */
static void test_bad_input_null_outputs_and_bad_devices(void **state)
{
    (void)state;
    size_t fr = 0, total = 0;
    tally_block_info_t info;
    void *p = tally_malloc(1000, 0, NULL);
    assert_non_null(p);
    cap_begin();
    EQ(tally_mem_get_info(0, NULL, &total), -TALLY_EINVAL);
    EQ(tally_mem_get_info(0, &fr, NULL), -TALLY_EINVAL);
    EQ(tally_mem_get_info(-1, &fr, &total), -TALLY_EINVAL);
    EQ(tally_mem_get_info(2, &fr, &total), -TALLY_EINVAL);
    EQ(tally_block_info(NULL, &info), -TALLY_EINVAL);
    EQ(tally_block_info(p, NULL), -TALLY_EINVAL);
    EQ(tally_set_memory_fraction(0.5, 2), -TALLY_EINVAL);
    EQ(tally_set_memory_fraction(0.5, -1), -TALLY_EINVAL);
    EQ(tally_empty_cache(-2), 0);
    EQ(tally_empty_cache(2), 0);
    EQ(tally_write_summary(2, 0, tu_buf_write, &(tu_buf_t){0}), -TALLY_EINVAL);
    EQ(tally_write_ledger(NULL, NULL), -TALLY_EINVAL);
    EQ(tally_write_leaks(1, NULL, NULL), -TALLY_EINVAL);
    EQ(tally_write_options(NULL, NULL), -TALLY_EINVAL);
    EQ(tally_write_stats_json(0, NULL, NULL), -TALLY_EINVAL);
    EQ(tally_record_stream(NULL, STREAM(1)), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 16);
    HAS(cap_text(), "tally_mem_get_info: NULL argument");
    HAS(cap_text(), "tally_empty_cache: device -2 does not exist");
    HAS(cap_text(), "tally_write_ledger: write is NULL");
    /* block_info of a pointer that is not a live block is quiet: it is how
     * callers ask "is this tally's?" */
    cap_begin();
    int on_stack;
    EQ(tally_block_info(&on_stack, &info), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 0);
    HAS(tally_last_error(), "is not a live block");
    tally_free(p);
    CHECK_OK();
}

/* record_stream: the block's own stream and a repeated stream are no-ops;
 * 4096 other streams are remembered, the 4097th is refused. */
static void test_bad_input_record_stream_limits(void **state)
{
    (void)state;
    void *p = tally_malloc(4096, 0, STREAM(1));
    assert_non_null(p);
    EQ(tally_record_stream(p, STREAM(1)), 0);
    EQ(tally_record_stream(p, STREAM(2)), 0);
    EQ(tally_record_stream(p, STREAM(2)), 0);
    for (int i = 0; i < 4095; i++)
        EQ(tally_record_stream(p, STREAM(1000 + i)), 0);
    cap_begin();
    EQ(tally_record_stream(p, STREAM(9000)), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 1);
    HAS(cap_text(), "already used on 4096 streams");
    tally_free(p); /* 4096 events, none pending: reusable at the next malloc */
    tally_stats_t s = tu_stats(0);
    EQ(s.active[0].current, 1);
    void *q = tally_malloc(4096, 0, STREAM(1));
    EQ(tu_stats(0).active[0].current, 1);
    tally_free(q);
    CHECK_OK();
}

/* The host backend holds at most 64 streams at once. */
static void test_bad_input_too_many_held_streams(void **state)
{
    (void)state;
    for (int i = 0; i < 64; i++)
        EQ(tally_host_stream_hold(STREAM(200 + i), 1), 0);
    EQ(tally_host_stream_hold(STREAM(200), 1), 0); /* again: no new slot */
    cap_begin();
    EQ(tally_host_stream_hold(STREAM(300), 1), -TALLY_ENOMEM);
    cap_end();
    HAS(cap_text(), "more than 64 streams held at once");
    EQ(tally_host_stream_hold(STREAM(301), 0), 0); /* releasing one never held */
    for (int i = 0; i < 64; i++)
        EQ(tally_host_stream_hold(STREAM(200 + i), 0), 0);
    EQ(tally_host_stream_hold(STREAM(300), 1), 0);
    EQ(tally_host_stream_hold(STREAM(300), 0), 0);
}

/* Stages nest at most 64 deep; the 65th begin is refused and changes
 * nothing. */
static void test_bad_input_stage_nesting_limit(void **state)
{
    (void)state;
    char name[32];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "level-%d", i);
        EQ(tally_stage_begin(name), 0);
    }
    cap_begin();
    EQ(tally_stage_begin("one-too-deep"), -TALLY_ESTATE);
    cap_end();
    HAS(cap_text(), "stages nested more than 64 deep");
    void *p = tally_malloc(100, 0, NULL);
    EQ(strcmp(tally_stage_name(tu_info(p).stage), "level-63"), 0);
    tally_free(p);
    cap_begin(); /* the survivor reports */
    for (int i = 63; i >= 0; i--) {
        snprintf(name, sizeof name, "level-%d", i);
        EQ(tally_stage_end(name), 0);
    }
    cap_end();
    EQ(tally_stage_end("level-0"), -TALLY_ESTATE);
}

/* The names reports use for "none" can be pushed: they are the same ids. */
static void test_bad_input_reserved_names_alias_the_defaults(void **state)
{
    (void)state;
    EQ(tally_tag_push("untagged"), 0);
    EQ(tally_stage_begin("(none)"), 0);
    void *p = tally_malloc(100, 0, NULL);
    tally_block_info_t i = tu_info(p);
    EQ(i.tag, 0);
    EQ(i.stage, 0);
    tally_free(p);
    cap_begin();
    EQ(tally_stage_end("(none)"), 0);
    cap_end();
    EQ(tally_tag_pop(), 0);
}

typedef struct fifo_reader {
    char path[300];
    char head[64];
    size_t total;
} fifo_reader_t;

static void *read_fifo(void *arg)
{
    fifo_reader_t *r = arg;
    FILE *f = fopen(r->path, "r");
    if (!f)
        return NULL;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (!r->total)
            snprintf(r->head, sizeof r->head, "%.*s", (int)(n < 40 ? n : 40), buf);
        r->total += n;
    }
    fclose(f);
    return NULL;
}

/* Report paths: none set, too long, a directory, a missing directory; a
 * FIFO (or /dev/null, /dev/stdout) is written in place rather than
 * replaced by a file; a symlink is followed and stays a symlink. */
static void test_bad_input_report_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/tally-faults-XXXXXX";
    assert_non_null(mkdtemp(dir));
    cap_begin();
    EQ(tally_write_report(NULL), -TALLY_EINVAL);
    HAS(tally_last_error(), "report_path is not set");
    /* The limit applies to the expanded path. %r is the rank: with RANK at
     * 1000000 (7 digits, whatever the process id) 200 copies of it take
     * 1400 bytes and do not fit in 1024; with RANK 0 the same 400-byte
     * pattern gives a 200-byte name that does. */
    const char *rank0 = getenv("RANK");
    char saved_rank[32] = "";
    if (rank0)
        snprintf(saved_rank, sizeof saved_rank, "%s", rank0);
    char longpath[700];
    int at = snprintf(longpath, sizeof longpath, "%s/%%p", dir);
    for (int i = 0; i < 200; i++)
        at += snprintf(longpath + at, sizeof longpath - (size_t)at, "%%r");
    setenv("RANK", "1000000", 1);
    EQ(tally_write_report(longpath), -TALLY_EINVAL);
    HAS(tally_last_error(), "tally_write_report: path '");
    HAS(tally_last_error(), "/%p%r%r");
    HAS(tally_last_error(), "is too long");
    setenv("RANK", "0", 1);
    EQ(tally_write_report(longpath), 0);
    char written[320];
    at = snprintf(written, sizeof written, "%s/%d", dir, (int)getpid());
    for (int i = 0; i < 200; i++)
        at += snprintf(written + at, sizeof written - (size_t)at, "0");
    assert_int_equal(unlink(written), 0);
    if (rank0)
        setenv("RANK", saved_rank, 1);
    else
        unsetenv("RANK");
    EQ(tally_write_report(dir), -TALLY_EIO);
    EQ(tally_write_report("/nonexistent-tally-dir/r.json"), -TALLY_EIO);
    cap_end();
    EQ(cap_lines(), 4);

    fifo_reader_t r = {.total = 0};
    snprintf(r.path, sizeof r.path, "%s/fifo", dir);
    assert_int_equal(mkfifo(r.path, 0600), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, read_fifo, &r), 0);
    EQ(tally_write_report(r.path), 0);
    pthread_join(t, NULL);
    struct stat st;
    assert_int_equal(lstat(r.path, &st), 0);
    if (!S_ISFIFO(st.st_mode))
        fail_msg("tally_write_report replaced the FIFO %s with a file (it would replace /dev/null too)", r.path);
    assert_true(r.total > 100);
    HAS(r.head, "{\"format\":\"tally-report\"");

    char target[320], link[320];
    snprintf(target, sizeof target, "%s/target.json", dir);
    snprintf(link, sizeof link, "%s/link.json", dir);
    FILE *f = fopen(target, "w");
    assert_non_null(f);
    fputs("old", f);
    fclose(f);
    assert_int_equal(symlink("target.json", link), 0);
    EQ(tally_write_report(link), 0);
    assert_int_equal(lstat(link, &st), 0);
    if (!S_ISLNK(st.st_mode))
        fail_msg("tally_write_report replaced the symlink %s with a file", link);
    f = fopen(target, "r");
    char head[40] = "";
    assert_non_null(f);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    HAS(head, "{\"format\":\"tally-report\"");
    remove(link);
    remove(target);
    remove(r.path);
    rmdir(dir);
}

/* The report's temporary file is created exclusively under a name nobody
 * can predict: a symlink planted at the old name (REPORT.tmpPID) in a shared
 * directory, pointing at another file, is left alone, the linked file is
 * not written, and no temporary file is left behind. */
static void test_report_temp_file_ignores_planted_links(void **state)
{
    (void)state;
    char dir[] = "/tmp/tally-plant-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char victim[320], report[320], planted[360];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(report, sizeof report, "%s/report.json", dir);
    snprintf(planted, sizeof planted, "%s.tmp%d", report, (int)getpid());
    FILE *f = fopen(victim, "w");
    assert_non_null(f);
    fputs("precious", f);
    fclose(f);
    assert_int_equal(symlink(victim, planted), 0);
    EQ(tally_write_report(report), 0);
    EQ(tally_write_report(report), 0);
    char head[40] = "";
    f = fopen(victim, "r");
    assert_non_null(f);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    if (strcmp(head, "precious") != 0)
        fail_msg("the report was written through the planted link %s into %s: %s", planted, victim, head);
    struct stat st;
    assert_int_equal(lstat(planted, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    f = fopen(report, "r");
    assert_non_null(f);
    memset(head, 0, sizeof head);
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    HAS(head, "{\"format\":\"tally-report\"");
    /* Only the three names: the victim, the link, the report. */
    DIR *d = opendir(dir);
    assert_non_null(d);
    int names = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') {
            names++;
            if (strstr(e->d_name, ".tmp-"))
                fail_msg("a temporary file was left behind: %s", e->d_name);
        }
    closedir(d);
    EQ(names, 3);
    remove(planted);
    remove(victim);
    remove(report);
    rmdir(dir);
}

/* Configuration strings test_api.c does not try: PyTorch keys tally has
 * no use for, strings and values over their limits, blanks. */
static void test_bad_input_configuration_strings(void **state)
{
    (void)state;
    char *before = tu_options_text();
    cap_begin();
    EQ(tally_configure("pinned_use_cuda_host_register:True"), -TALLY_ECONF);
    HAS(tally_last_error(), "'pinned_use_cuda_host_register' (a PyTorch setting) is not supported by tally");
    EQ(tally_configure("release_lock_on_cudamalloc:true"), -TALLY_ECONF);
    HAS(tally_last_error(), "not supported by tally");
    static char big[5000];
    memset(big, 'x', sizeof big - 1);
    memcpy(big, "stage_report:", 13);
    EQ(tally_configure(big), -TALLY_ECONF);
    HAS(tally_last_error(), "longer than 4096 characters");
    static char path[600] = "report_path:/tmp/";
    memset(path + strlen(path), 'r', sizeof path - 1 - strlen(path));
    EQ(tally_configure(path), -TALLY_ECONF);
    HAS(tally_last_error(), "report_path: value longer than 511 characters");
    cap_end();
    EQ(cap_lines(), 4);
    char *after = tu_options_text();
    assert_string_equal(before, after);
    free(after);
    /* Blanks around items and empty items are fine. */
    EQ(tally_configure("  stage_report:false , ,leak_report:off  ,"), 0);
    /* An empty first item (nothing before the first comma), and nothing at all. */
    EQ(tally_configure(",stage_report:false"), 0);
    EQ(tally_configure(""), 0);
    EQ(tally_configure(","), 0);
    after = tu_options_text();
    HAS(after, "stage_report:false");
    free(after);
    EQ(tally_configure("stage_report:true"), 0);
    free(before);
}

/* Names go into JSON reports: one that is not valid UTF-8 is refused, so
 * every report stays JSON that Python's json module (or any strict reader)
 * accepts (docs/bad-input.md, "Fixed while writing this table"). */
static void test_non_utf8_names_are_refused(void **state)
{
    (void)state;
    char path[] = "/tmp/tally-utf8-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int rc = tally_tag_push("bad\xff\xfename");
    void *p = tally_malloc(100, 0, NULL);
    if (rc == 0)
        tally_tag_pop();
    EQ(tally_write_report(path), 0);
    tally_free(p);
    size_t n = 0;
    FILE *f = fopen(path, "rb");
    static unsigned char buf[1 << 20];
    n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    remove(path);
    for (size_t i = 0; i < n; i++) {
        unsigned c = buf[i];
        int k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 1 : (c & 0xf0) == 0xe0 ? 2
              : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 3 : -1;
        if (k < 0)
            fail_msg("the report is not UTF-8: byte 0x%02x at offset %zu (the name was accepted: %d)", c, i, rc);
        for (int j = 1; j <= k; j++)
            if (i + (size_t)j >= n || (buf[i + (size_t)j] & 0xc0) != 0x80)
                fail_msg("the report is not UTF-8 at offset %zu", i);
        i += (size_t)k;
    }
}

/* tally_write_options promises a form that parses back: the defaults
 * (garbage_collection_threshold and memory_fraction at 0, meaning off)
 * included (docs/bad-input.md, "Fixed while writing this table"). */
static void test_printed_configuration_parses_back(void **state)
{
    (void)state;
    char *text = tu_options_text();
    /* As python/tally/_options.py reads it: text before "    #", joined. */
    tu_buf_t conf = {0};
    tu_buf_write(&conf, "", 0);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *hash = strstr(line, "    #");
        if (hash)
            *hash = 0;
        if (conf.len)
            tu_buf_write(&conf, ",", 1);
        tu_buf_write(&conf, line, strlen(line));
    }
    tally_options_t o;
    tally__options_default(&o);
    cap_begin();
    int rc = tally__options_parse(&o, conf.p, false, NULL);
    cap_end();
    if (rc != 0)
        fail_msg("the printed configuration does not parse back: %s", tally_last_error());
    tu_buf_free(&conf);
    free(text);
}

/* Names are UTF-8 by the standard's rules (RFC 3629): each malformed form
 * is refused by tally_tag_push and tally_stage_begin alike, and the
 * boundary code points of each length are accepted. */
static void test_names_follow_utf8_rules(void **state)
{
    (void)state;
    static const char *const refused[] = {
        "\x80",             /* a continuation byte alone */
        "a\xbf",            /* one at the end */
        "\xc0\x80",         /* overlong NUL */
        "\xc1\xbf",         /* overlong U+007F */
        "\xe0\x80\x80",     /* overlong, three bytes */
        "\xe0\x9f\xbf",     /* overlong U+07FF, the largest three-byte one */
        "\xf0\x8f\xbf\xbf", /* overlong U+FFFF */
        "\xf0\x80\x80\x80", /* overlong, four bytes */
        "\xc2",             /* cut short */
        "\xe2\x82",         /* cut short */
        "x\xf0\x9f\x98",    /* cut short at the end */
        "\xed\xa0\x80",     /* a surrogate, U+D800 */
        "\xed\xbf\xbf",     /* a surrogate, U+DFFF */
        "\xf4\x90\x80\x80", /* U+110000 */
        "\xf8\x88\x80\x80\x80", /* five bytes */
        "\xc3\x28",         /* a lead byte without its continuation */
    };
    static const char *const accepted[] = {
        "\x7e",             /* the last printable one-byte character */
        "\xc2\x80",         /* U+0080, the first two-byte one */
        "\xdf\xbf",         /* U+07FF */
        "\xe0\xa0\x80",     /* U+0800 */
        "\xed\x9f\xbf",     /* U+D7FF, just below the surrogates */
        "\xee\x80\x80",     /* U+E000, just above */
        "\xef\xbf\xbd",     /* U+FFFD */
        "\xf0\x90\x80\x80", /* U+10000 */
        "\xf4\x8f\xbf\xbf", /* U+10FFFF */
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        tu_ctx("refused name %zu", i);
        cap_begin();
        EQ(tally_tag_push(refused[i]), -TALLY_EINVAL);
        EQ(tally_stage_begin(refused[i]), -TALLY_EINVAL);
        cap_end();
        HAS(tally_last_error(), "UTF-8");
    }
    for (size_t i = 0; i < sizeof accepted / sizeof *accepted; i++) {
        tu_ctx("accepted name %zu", i);
        cap_begin();
        EQ(tally_tag_push(accepted[i]), 0);
        EQ(tally_tag_pop(), 0);
        EQ(tally_stage_begin(accepted[i]), 0);
        EQ(tally_stage_end(accepted[i]), 0);
        cap_end();
    }
    tu_ctx("%s", "");
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:80GiB,host_mode:virtual,leak_report:off");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input_huge_sizes_are_out_of_memory),
        cmocka_unit_test(test_bad_input_null_outputs_and_bad_devices),
        cmocka_unit_test(test_bad_input_record_stream_limits),
        cmocka_unit_test(test_bad_input_too_many_held_streams),
        cmocka_unit_test(test_bad_input_stage_nesting_limit),
        cmocka_unit_test(test_bad_input_reserved_names_alias_the_defaults),
        cmocka_unit_test(test_bad_input_report_paths),
        cmocka_unit_test(test_report_temp_file_ignores_planted_links),
        cmocka_unit_test(test_bad_input_configuration_strings),
        cmocka_unit_test(test_non_utf8_names_are_refused),
        cmocka_unit_test(test_names_follow_utf8_rules),
        cmocka_unit_test(test_printed_configuration_parses_back),
    };
    return cmocka_run_group_tests_name("bad_input", tests, NULL, NULL);
}
