/* The public API's edges: bad input is rejected with one line on the
 * diagnostics sink naming what was wrong, and changes nothing; then the
 * statistics calls (JSON keys, peak and accumulated resets).
 *
 * The first tests run before the library initialises (a forked child with a
 * bad TALLY_CONF; tally_configure of keys that are only valid before
 * initialisation), so their order in main() matters. Two simulated devices,
 * backed by host memory. */
#include "testutil.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define S1 STREAM(1)
#define S2 STREAM(2)

/* ---- before initialisation -------------------------------------------------- */

/* In a child: a check that fails exits with the line number. */
#define CHILD_REQUIRE(c)                                                                                           \
    do {                                                                                                           \
        if (!(c)) {                                                                                                \
            fprintf(stderr, "child: %s:%d: %s failed (last error: %s)\n", __FILE__, __LINE__, #c,                  \
                    tally_last_error());                                                                           \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

/* Fork a child that sets TALLY_CONF to conf and initialises: init must fail
 * with a message naming both words, and the library must stay unusable. */
static void expect_init_fails(const char *conf, const char *word1, const char *word2)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_conf(conf);
        cap_begin();
        int rc = tally_init();
        CHILD_REQUIRE(rc == -TALLY_ECONF);
        CHILD_REQUIRE(strstr(tally_last_error(), "TALLY_CONF") != NULL);
        CHILD_REQUIRE(strstr(tally_last_error(), word1) != NULL);
        CHILD_REQUIRE(strstr(tally_last_error(), word2) != NULL);
        CHILD_REQUIRE(strstr(cap_text(), word1) != NULL);
        CHILD_REQUIRE(cap_lines() >= 1);
        CHILD_REQUIRE(tally_malloc(4096, 0, NULL) == NULL);
        CHILD_REQUIRE(strstr(tally_last_error(), word1) != NULL);
        CHILD_REQUIRE(tally_device_count() < 0);
        CHILD_REQUIRE(tally_init() == -TALLY_ECONF);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child with TALLY_CONF=%s: status %d (see its message above)", conf, status);
}

static void test_bad_env_conf_makes_init_fail(void **state)
{
    (void)state;
    expect_init_fails("backend:host,max_split_size_mb:10", "max_split_size_mb", "'10'");
    expect_init_fails("backend:host,bogus_key:1", "bogus_key", "unknown");
    expect_init_fails("host_capacity:abc,backend:host", "host_capacity", "'abc'");
    expect_init_fails("backend:host,garbage_collection_threshold:1.5", "garbage_collection_threshold", "'1.5'");
}

typedef struct bad_conf {
    const char *conf;
    const char *word1, *word2; /* both must appear in the message */
} bad_conf_t;

static void expect_rejected(const bad_conf_t *cases, size_t n)
{
    char *before = tu_options_text();
    for (size_t i = 0; i < n; i++) {
        cap_begin();
        int rc = tally_configure(cases[i].conf);
        cap_end();
        if (rc != -TALLY_ECONF)
            fail_msg("tally_configure(\"%s\") returned %d, expected %d", cases[i].conf, rc, -TALLY_ECONF);
        HAS(tally_last_error(), cases[i].word1);
        HAS(tally_last_error(), cases[i].word2);
        HAS(cap_text(), cases[i].word1);
        EQ(cap_lines(), 1);
        char *after = tu_options_text();
        if (strcmp(before, after) != 0)
            fail_msg("tally_configure(\"%s\") failed but changed the options:\n%s\nnow:\n%s", cases[i].conf, before,
                     after);
        free(after);
    }
    free(before);
}

static void test_configure_before_init_rejects_bad_values(void **state)
{
    (void)state;
    static const bad_conf_t cases[] = {
        {"bogus_key:1", "unknown key", "bogus_key"},
        {"ledger:maybe", "ledger", "'maybe'"},
        {"max_split_size_mb:10", "max_split_size_mb", "'10'"},
        {"max_split_size_mb:19", "max_split_size_mb", "'19'"},
        {"garbage_collection_threshold:1.5", "garbage_collection_threshold", "'1.5'"},
        {"garbage_collection_threshold:1", "garbage_collection_threshold", "'1'"},
        {"garbage_collection_threshold:-0.1", "garbage_collection_threshold", "'-0.1'"},
        {"host_capacity:abc", "host_capacity", "'abc'"},
        {"host_capacity:1000.5", "host_capacity", "'1000.5'"}, /* half a byte */
        /* 2^64 bytes and more do not fit a size (2^64 - 1 rounds to 2^64 as a double) */
        {"host_capacity:16777216TiB", "host_capacity", "'16777216TiB'"},
        {"host_capacity:18446744073709551615", "host_capacity", "'18446744073709551615'"},
        {"host_capacity:1e30", "host_capacity", "'1e30'"},
        /* a key that takes any size up to 2^64 - 1 (its default) */
        {"async_release_threshold:16777216TiB", "async_release_threshold", "'16777216TiB'"},
        {"async_release_threshold:18446744073709551616", "async_release_threshold", "'18446744073709551616'"},
        {"async_release_threshold:1e30", "async_release_threshold", "'1e30'"},
        {"roundup_power2_divisions:3", "roundup_power2_divisions", "'3'"},
        {"roundup_power2_divisions:[256:3]", "roundup_power2_divisions", "'3'"},
        {"roundup_power2_divisions:[100:4]", "roundup_power2_divisions", "'100'"},
        {"roundup_power2_divisions:[4:2,4:8]", "roundup_power2_divisions", "must increase"},
        /* 32 GiB and 64 GiB share the last slot (sizes of 32 GiB and up). */
        {"roundup_power2_divisions:[32768:2,65536:4]", "roundup_power2_divisions", "must increase ('65536')"},
        {"memory_fraction:1.5", "memory_fraction", "'1.5'"},
        {"backend:tpu", "backend", "'tpu'"},
        {"host_devices:0", "host_devices", "'0'"},
        /* One bad item fails the whole string; the good one is not applied. */
        {"max_split_size_mb:40,host_capacity:abc", "host_capacity", "'abc'"},
        {"ledger:false,stage_report:maybe", "stage_report", "'maybe'"},
        {"novalue", "novalue", "key:value"},
    };
    expect_rejected(cases, sizeof cases / sizeof cases[0]);
    /* Still not initialised: the real configuration is untouched. */
}

/* An integer option's bounds are its own values: expandable_grow_chunk_mb
 * takes 2 (only a block's own pages) to 1024, and refuses 1 and 1025 naming
 * the key and the value; each accepted value is what the options then say. */
static void test_integer_option_takes_its_bounds(void **state)
{
    (void)state;
    static const struct {
        const char *value;
        bool ok;
    } cases[] = {{"2", true}, {"1024", true}, {"1", false}, {"1025", false}, {"20", true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char conf[64], want[64];
        snprintf(conf, sizeof conf, "expandable_grow_chunk_mb:%s", cases[i].value);
        cap_begin();
        int rc = tally_configure(conf);
        cap_end();
        if (cases[i].ok != (rc == 0))
            fail_msg("tally_configure(\"%s\") returned %d: %s", conf, rc, tally_last_error());
        if (!cases[i].ok) {
            snprintf(want, sizeof want, "'%s'", cases[i].value);
            HAS(tally_last_error(), "expandable_grow_chunk_mb");
            HAS(tally_last_error(), want);
            continue;
        }
        char *opts = tu_options_text();
        snprintf(want, sizeof want, "expandable_grow_chunk_mb:%s", cases[i].value);
        HAS(opts, want);
        free(opts);
    }
}

/* roundup_power2_divisions:[] is a list of no entries: every slot is 0
 * (no rounding), as the empty list PyTorch's parser reads; the shortest
 * value with both brackets is taken, not called unclosed. */
static void test_roundup_empty_list_turns_rounding_off(void **state)
{
    (void)state;
    cap_begin();
    int set = tally_configure("roundup_power2_divisions:4");
    int empty = tally_configure("roundup_power2_divisions:[]");
    int open = tally_configure("roundup_power2_divisions:[");
    cap_end();
    if (set != 0)
        fail_msg("roundup_power2_divisions:4 refused: %s", tally_last_error());
    if (empty != 0)
        fail_msg("roundup_power2_divisions:[] refused: %s", tally_last_error());
    assert_int_equal(open, -TALLY_ECONF);
    HAS(tally_last_error(), "'[' lacks a closing ']'");
    char *opts = tu_options_text();
    HAS(opts, "roundup_power2_divisions:0");
    free(opts);
}

/* ---- after initialisation --------------------------------------------------- */

static void test_initialises_with_the_env_conf(void **state)
{
    (void)state;
    assert_int_equal(tally_init(), 0);
    assert_int_equal(tally_device_count(), 2);
    assert_string_equal(tally_backend_name(), "host");
    size_t free_b = 0, total = 0;
    assert_int_equal(tally_mem_get_info(1, &free_b, &total), 0);
    EQ(total, 8 * GiB);
    EQ(free_b, 8 * GiB);
    char *opts = tu_options_text();
    HAS(opts, "max_split_size_mb:none");
    free(opts);
}

static void test_configure_after_init_rejects_bad_values(void **state)
{
    (void)state;
    static const bad_conf_t cases[] = {
        {"bogus_key:1", "unknown key", "bogus_key"},
        {"stage_report:maybe", "stage_report", "'maybe'"},
        {"garbage_collection_threshold:1.5", "garbage_collection_threshold", "'1.5'"},
        {"memory_fraction:2", "memory_fraction", "'2'"},
        /* Keys that only apply at initialisation are refused afterwards. */
        {"host_capacity:1GiB", "host_capacity", "initiali"},
        {"max_split_size_mb:40", "max_split_size_mb", "initiali"},
        {"roundup_power2_divisions:4", "roundup_power2_divisions", "initiali"},
        {"stage_report:false,garbage_collection_threshold:1.5", "garbage_collection_threshold", "'1.5'"},
    };
    expect_rejected(cases, sizeof cases / sizeof cases[0]);
    cap_begin();
    assert_true(tally_configure(NULL) < 0);
    cap_end();
    EQ(cap_lines(), 1);
    /* A good runtime key does change the options. */
    char *before = tu_options_text();
    assert_int_equal(tally_configure("stage_report:false"), 0);
    char *after = tu_options_text();
    HAS(after, "stage_report:false");
    assert_string_not_equal(before, after);
    assert_int_equal(tally_configure("stage_report:true"), 0);
    free(after);
    after = tu_options_text();
    assert_string_equal(before, after);
    free(before);
    free(after);
}

static void test_malloc_size_zero_is_null_without_error(void **state)
{
    (void)state;
    cap_begin();
    assert_true(tally_set_memory_fraction(2.0, 0) < 0); /* a known last error */
    cap_end();
    char known[512];
    snprintf(known, sizeof known, "%s", tally_last_error());
    tally_stats_t a = tu_stats(0);
    cap_begin();
    assert_null(tally_malloc(0, 0, NULL));
    assert_null(tally_malloc(0, 1, S1));
    cap_end();
    EQ(cap_lines(), 0);
    assert_string_equal(tally_last_error(), known);
    tally_stats_t b = tu_stats(0);
    EQ(b.num_device_alloc, a.num_device_alloc);
    tu_expect_same_usage(&a, &b);
}

static void test_malloc_negative_size_is_rejected(void **state)
{
    (void)state;
    tally_stats_t a = tu_stats(0);
    cap_begin();
    assert_null(tally_malloc((size_t)-1, 0, NULL));
    cap_end();
    EQ(cap_lines(), 1);
    HAS(cap_text(), "18446744073709551615");
    HAS(tally_last_error(), "18446744073709551615");
    cap_begin();
    assert_null(tally_malloc((size_t)1 << 63, 0, NULL));
    cap_end();
    EQ(cap_lines(), 1);
    HAS(cap_text(), "9223372036854775808");
    tally_stats_t b = tu_stats(0);
    EQ(b.num_ooms, a.num_ooms);
    EQ(b.num_device_alloc, a.num_device_alloc);
    tu_expect_same_usage(&a, &b);
}

static void test_malloc_unknown_device_is_rejected(void **state)
{
    (void)state;
    static const int bad[] = {-1, 2, 1000, -7};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[32];
        snprintf(want, sizeof want, "device %d", bad[i]);
        cap_begin();
        assert_null(tally_malloc(4096, bad[i], NULL));
        cap_end();
        EQ(cap_lines(), 1);
        HAS(cap_text(), want);
        HAS(tally_last_error(), want);
    }
    cap_begin();
    EQ(tally_empty_cache(7), 0);
    assert_true(tally_reset_peak_stats(-1) < 0);
    assert_true(tally_reset_accumulated_stats(2) < 0);
    tally_stats_t s;
    assert_true(tally_get_stats(2, &s) < 0);
    assert_true(tally_get_stats(0, NULL) < 0);
    tu_buf_t b = {0};
    assert_true(tally_write_stats_json(9, tu_buf_write, &b) < 0);
    EQ(b.len, 0);
    cap_end();
    EQ(cap_lines(), 6);
    HAS(cap_text(), "device 7");
    HAS(cap_text(), "device 9");
}

static void test_free_of_foreign_pointer_is_reported_and_ignored(void **state)
{
    (void)state;
    void *live = tally_malloc(1000, 0, S1);
    tally_stats_t a = tu_stats(0);
    int on_stack = 0;
    void *foreign[] = {&on_stack, (void *)0x1234};
    for (size_t i = 0; i < 2; i++) {
        char want[64];
        snprintf(want, sizeof want, "%p", foreign[i]);
        cap_begin();
        tally_free(foreign[i]);
        cap_end();
        EQ(cap_lines(), 1);
        HAS(cap_text(), want);
        HAS(cap_text(), "tally_free");
    }
    cap_begin();
    tally_free(NULL);
    cap_end();
    EQ(cap_lines(), 0);
    tally_stats_t b = tu_stats(0);
    tu_expect_same_usage(&a, &b);
    EQ(b.reserved_bytes[0].current, a.reserved_bytes[0].current);
    EQ(tu_info(live).requested_size, 1000);
    CHECK_OK();
    tally_free(live);
    CHECK_OK();
}

static void test_double_free_names_tag_and_stage(void **state)
{
    (void)state;
    cap_begin(); /* the stage report goes here too */
    assert_int_equal(tally_tag_push("weights"), 0);
    assert_int_equal(tally_stage_begin("load"), 0);
    void *p = tally_malloc(3000, 1, S2);
    assert_non_null(p);
    tally_block_info_t info = tu_info(p);
    assert_string_equal(tally_tag_name(info.tag), "weights");
    assert_string_equal(tally_stage_name(info.stage), "load");
    assert_int_equal(tally_stage_end("load"), 0);
    assert_int_equal(tally_tag_pop(), 0);
    tally_free(p);
    tally_stats_t a = tu_stats(1);
    cap_clear();
    tally_free(p);
    cap_end();
    EQ(cap_lines(), 1);
    char addr[32];
    snprintf(addr, sizeof addr, "%p", p);
    HAS(cap_text(), "double free");
    HAS(cap_text(), addr);
    HAS(cap_text(), "weights");
    HAS(cap_text(), "load");
    HAS(cap_text(), "3000");
    HAS(tally_last_error(), "double free");
    tally_stats_t b = tu_stats(1);
    tu_expect_same_usage(&a, &b);
    EQ(b.inactive_split[0].current, a.inactive_split[0].current);
    CHECK_OK();
}

static void test_interior_pointer_free_is_reported(void **state)
{
    (void)state;
    char *p = tally_malloc(4096, 0, S1);
    tally_stats_t a = tu_stats(0);
    cap_begin();
    tally_free(p + 512);
    cap_end();
    EQ(cap_lines(), 1);
    char addr[32];
    snprintf(addr, sizeof addr, "%p", (void *)(p + 512));
    HAS(cap_text(), addr);
    tally_stats_t b = tu_stats(0);
    tu_expect_same_usage(&a, &b);
    EQ(tu_info(p).size, 4096);
    CHECK_OK();
    tally_free(p);
    CHECK_OK();
}

static void test_free_checked_detects_wrong_size_and_device(void **state)
{
    (void)state;
    void *p = tally_malloc(1000, 1, NULL);
    assert_int_equal(tally_free_checked(p, 1000, 1), 0);

    int64_t live = tu_stats(1).allocation[0].current;
    void *q = tally_malloc(1000, 1, NULL);
    cap_begin();
    assert_int_equal(tally_free_checked(q, 999, 1), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 1);
    HAS(cap_text(), "1000");
    HAS(cap_text(), "999");
    EQ(tu_stats(1).allocation[0].current, live); /* freed anyway */

    void *r = tally_malloc(100, 0, NULL);
    int64_t live0 = tu_stats(0).allocation[0].current;
    cap_begin();
    assert_int_equal(tally_free_checked(r, 100, 1), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 1);
    HAS(cap_text(), "device 0");
    EQ(tu_stats(0).allocation[0].current, live0 - 1);

    cap_begin();
    assert_int_equal(tally_free_checked(r, 100, 0), -TALLY_EINVAL); /* already freed */
    assert_int_equal(tally_free_checked((void *)0x1234, 8, 0), -TALLY_EINVAL);
    cap_end();
    EQ(cap_lines(), 2);
    HAS(cap_text(), "double free");
    HAS(cap_text(), "0x1234");
    assert_int_equal(tally_free_checked(NULL, 5, 0), 0);
    CHECK_OK();
}

static void test_record_stream_rejects_unknown_pointers(void **state)
{
    (void)state;
    cap_begin();
    assert_int_equal(tally_record_stream((void *)0x1234, S1), -TALLY_EINVAL);
    assert_true(tally_record_stream(NULL, S1) < 0);
    cap_end();
    EQ(cap_lines(), 2);
    HAS(cap_text(), "tally_record_stream");
    HAS(cap_text(), "0x1234");
    /* Recording the block's own stream is a no-op: the free is immediate. */
    void *p = tally_malloc(4096, 0, S1);
    assert_int_equal(tally_record_stream(p, S1), 0);
    tally_free(p);
    EQ(tu_stats(0).active[0].current, 0);
    CHECK_OK();
}

static void test_backed_blocks_are_writable_and_disjoint(void **state)
{
    (void)state;
    unsigned char *a = tally_malloc(5000, 0, S1);
    unsigned char *b = tally_malloc(3 * MiB, 0, S1);
    unsigned char *c = tally_malloc(5000, 0, S1);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    memset(a, 0xAA, 5000);
    memset(b, 0xBB, 3 * MiB);
    memset(c, 0xCC, 5000);
    for (size_t i = 0; i < 5000; i++)
        if (a[i] != 0xAA || c[i] != 0xCC)
            fail_msg("byte %zu overwritten", i);
    EQ(b[0], 0xBB);
    EQ(b[3 * MiB - 1], 0xBB);
    tally_free(a);
    tally_free(b);
    tally_free(c);
    CHECK_OK();
}

static void test_tag_and_stage_misuse_is_reported(void **state)
{
    (void)state;
    cap_begin();
    assert_true(tally_tag_pop() < 0);
    assert_true(tally_tag_push(NULL) < 0);
    assert_true(tally_tag_push("") < 0);
    assert_true(tally_stage_end("never") < 0);
    assert_int_equal(tally_stage_begin("outer"), 0);
    assert_true(tally_stage_end("inner") < 0);
    HAS(tally_last_error(), "outer");
    assert_int_equal(tally_stage_end("outer"), 0);
    cap_end();
    HAS(cap_text(), "never");
}

/* ---- statistics resets (torch.cuda.reset_*_memory_stats) -------------------- */

static void test_reset_peak_sets_peak_to_current(void **state)
{
    (void)state;
    tu_reset();
    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = tu_malloc(12 * MiB, 0, S1);
    tu_free(p[1]);
    tu_free(p[2]);
    tally_stats_t s = tu_stats(0);
    EQ(s.allocation[0].current, 1);
    assert_true(s.allocation[0].peak >= 3);
    assert_true(s.allocated_bytes[TALLY_POOL_LARGE].peak >= (int64_t)(36 * MiB));
    assert_int_equal(tally_reset_peak_stats(0), 0);
    s = tu_stats(0);
    for (int k = 0; k < TALLY_POOL_COUNT; k++) {
        EQ(s.allocation[k].peak, s.allocation[k].current);
        EQ(s.allocated_bytes[k].peak, s.allocated_bytes[k].current);
        EQ(s.reserved_bytes[k].peak, s.reserved_bytes[k].current);
        EQ(s.active[k].peak, s.active[k].current);
        EQ(s.requested_bytes[k].peak, s.requested_bytes[k].current);
        EQ(s.inactive_split_bytes[k].peak, s.inactive_split_bytes[k].current);
        EQ(s.segment[k].peak, s.segment[k].current);
    }
    EQ(s.allocation[0].peak, 1);
    EQ(s.allocated_bytes[0].peak, 12 * MiB);
    EQ(s.reserved_bytes[0].peak, 36 * MiB);
    int64_t allocated_before = s.allocation[0].allocated;
    void *q = tu_malloc(12 * MiB, 0, S1);
    s = tu_stats(0);
    EQ(s.allocation[0].peak, 2);
    EQ(s.allocated_bytes[0].peak, 24 * MiB);
    EQ(s.allocation[0].allocated, allocated_before + 1); /* accumulations untouched */
    tu_free(q);
    /* A reset takes the values of now, not those of the last read. */
    assert_int_equal(tally_reset_peak_stats(0), 0);
    s = tu_stats(0);
    EQ(s.allocation[0].peak, 1);
    EQ(s.allocated_bytes[0].peak, 12 * MiB);
    tu_free(p[0]);
    CHECK_OK();
}

/* Run on device 1, last of the device-1 tests: after it, allocated - freed
 * no longer equals current there. */
static void test_reset_accumulated_zeroes_counts(void **state)
{
    (void)state;
    tu_reset();
    void *a = tu_malloc(4096, 1, S1);
    tu_free(tu_malloc(4096, 1, S1));
    cap_begin();
    assert_null(tally_malloc(100 * GiB, 1, S1)); /* an OOM: counted, then reset */
    cap_end();
    tally_empty_cache(1);
    tally_stats_t s = tu_stats(1);
    assert_true(s.allocation[0].allocated > 0 && s.num_device_alloc > 0 && s.num_sync_all_streams > 0);
    assert_true(s.num_ooms > 0 && s.num_alloc_retries > 0);
    int64_t peak = s.allocation[0].peak;
    assert_int_equal(tally_reset_accumulated_stats(1), 0);
    s = tu_stats(1);
    for (int k = 0; k < TALLY_POOL_COUNT; k++) {
        EQ(s.allocation[k].allocated, 0);
        EQ(s.allocation[k].freed, 0);
        EQ(s.allocated_bytes[k].allocated, 0);
        EQ(s.reserved_bytes[k].freed, 0);
        EQ(s.requested_bytes[k].allocated, 0);
        EQ(s.segment[k].allocated, 0);
    }
    EQ(s.oversize_allocations.allocated, 0);
    EQ(s.num_alloc_retries, 0);
    EQ(s.num_ooms, 0);
    EQ(s.num_sync_all_streams, 0);
    EQ(s.num_device_alloc, 0);
    EQ(s.num_device_free, 0);
    EQ(s.max_split_size, -1);
    EQ(s.allocation[0].current, 1); /* current and peak stay */
    EQ(s.allocation[0].peak, peak);
    EQ(s.reserved_bytes[0].current, 2 * MiB);
    CHECK_OK();
    tu_free(a);
    s = tu_stats(1);
    EQ(s.allocation[0].freed, 1);
    EQ(s.allocated_bytes[0].freed, 4096);
    EQ(s.allocation[0].allocated, 0);
    CHECK_OK();
}

/* ---- statistics as torch.cuda.memory_stats() JSON ------------------------- */

static void test_stats_json_has_the_122_sorted_torch_keys(void **state)
{
    (void)state;
    tu_clean_all();
    void *p = tally_malloc(512, 0, S1);
    tu_buf_t b = {0};
    assert_int_equal(tally_write_stats_json(0, tu_buf_write, &b), 0);
    assert_non_null(b.p);
    EQ(b.p[0], '{');
    EQ(b.p[b.len - 1], '}');
    char prev[64] = "", first[64] = "", last[64] = "";
    int n = 0;
    for (const char *q = b.p; (q = strchr(q, '"')) != NULL;) {
        const char *e = strchr(q + 1, '"');
        assert_non_null(e);
        char key[64];
        assert_true((size_t)(e - q - 1) < sizeof key);
        memcpy(key, q + 1, (size_t)(e - q - 1));
        key[e - q - 1] = 0;
        if (n && strcmp(prev, key) >= 0)
            fail_msg("keys out of order: \"%s\" then \"%s\"", prev, key);
        if (!n)
            strcpy(first, key);
        strcpy(prev, key);
        strcpy(last, key);
        n++;
        q = e + 1;
    }
    EQ(n, 122);
    assert_string_equal(first, "active.all.allocated");
    assert_string_equal(last, "segment.small_pool.peak");
    HAS(b.p, "\"allocation.all.current\": 1");
    HAS(b.p, "\"allocation.small_pool.current\": 1");
    HAS(b.p, "\"allocation.large_pool.current\": 0");
    HAS(b.p, "\"reserved_bytes.all.current\": 2097152");
    HAS(b.p, "\"requested_bytes.small_pool.current\": 512");
    HAS(b.p, "\"max_split_size\": -1");
    HAS(b.p, "\"num_sync_all_streams\": ");
    HAS(b.p, "\"oversize_allocations.freed\": 0");
    HAS(b.p, "\"oversize_segments.peak\": 0");
    HAS(b.p, "\"inactive_split_bytes.small_pool.current\": 2096640");
    assert_null(strstr(b.p, "\"allocated.all"));
    assert_null(strstr(b.p, "largest_free_block"));
    assert_null(strstr(b.p, "utilisation"));
    tu_buf_free(&b);
    tally_free(p);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:8GiB,host_mode:backed");
    const struct CMUnitTest tests[] = {
        /* These two must run first: nothing may initialise tally before. */
        cmocka_unit_test(test_bad_env_conf_makes_init_fail),
        cmocka_unit_test(test_configure_before_init_rejects_bad_values),
        cmocka_unit_test(test_roundup_empty_list_turns_rounding_off),
        cmocka_unit_test(test_initialises_with_the_env_conf),
        cmocka_unit_test(test_configure_after_init_rejects_bad_values),
        cmocka_unit_test(test_integer_option_takes_its_bounds),
        cmocka_unit_test(test_malloc_size_zero_is_null_without_error),
        cmocka_unit_test(test_malloc_negative_size_is_rejected),
        cmocka_unit_test(test_malloc_unknown_device_is_rejected),
        cmocka_unit_test(test_free_of_foreign_pointer_is_reported_and_ignored),
        cmocka_unit_test(test_double_free_names_tag_and_stage),
        cmocka_unit_test(test_interior_pointer_free_is_reported),
        cmocka_unit_test(test_free_checked_detects_wrong_size_and_device),
        cmocka_unit_test(test_record_stream_rejects_unknown_pointers),
        cmocka_unit_test(test_backed_blocks_are_writable_and_disjoint),
        cmocka_unit_test(test_tag_and_stage_misuse_is_reported),
        cmocka_unit_test(test_stats_json_has_the_122_sorted_torch_keys),
        cmocka_unit_test(test_reset_peak_sets_peak_to_current),
        cmocka_unit_test(test_reset_accumulated_zeroes_counts), /* last: device 1's counts reset */
    };
    return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
