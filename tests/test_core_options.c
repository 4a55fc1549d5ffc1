/* Configuration that changes the caching rules: roundup_power2_divisions
 * (single number and interval list), host_capacity's units, the effective
 * configuration written back, runtime keys and the reader of sizes.
 * max_split_size_mb (oversize blocks, the reuse allowance,
 * release_available_cached_blocks) is in test_core_options_max_split.c;
 * what both share is in optionsutil.h.
 *
 * This process runs with
 *   max_split_size_mb:40, roundup_power2_divisions:[1:4,2:0,64:8,>:2]
 * which by the notes' rule gives the divisions table
 *   slot 0 (< 2 MiB) 4, slots 1..5 (2..64 MiB) 0, slot 6 (64..128 MiB) 8,
 *   slots 7..15 (>= 128 MiB) 2.
 * Expected sizes below are worked out by hand from notes §6; tu_round (the
 * test's own implementation of the rule) is checked against them too. */
#include "optionsutil.h"

#include "core/internal.h" /* tally__parse_size */

static const unsigned divs[16] = {4, 0, 0, 0, 0, 0, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2};

/* ---- divisions: single number, in a child with its own TALLY_CONF -------- */

/* Runs first, before this process initialises tally. */
static void test_divisions_single_number_in_a_child(void **state)
{
    (void)state;
    static const child_case_t cases[] = {
        {1200 * KiB, 1280 * KiB}, /* floor power of two 1 MiB, step 1 MiB / 4 = 256 KiB */
        {5 * MiB + 1, 6 * MiB},   /* step 4 MiB / 4 = 1 MiB */
        {8 * MiB, 8 * MiB},       /* powers of two stay */
        {1200, 1536},             /* not above 512 * 4: plain 512 rounding */
        {3000, 3072},             /* step 2048 / 4 = 512 */
        {700 * KiB, 768 * KiB},   /* step 128 KiB */
        {33 * GiB + 1, 40 * GiB}, /* step 32 GiB / 4 = 8 GiB */
        /* On a division boundary a size keeps its size. */
        {1280 * KiB, 1280 * KiB}, /* 1 MiB + 256 KiB */
        {2560, 2560},             /* 2048 + 512 */
        {6 * MiB, 6 * MiB},       /* 4 MiB + 2 * 1 MiB */
    };
    child_rounding("backend:host,host_mode:virtual,roundup_power2_divisions:4", cases,
                   sizeof cases / sizeof cases[0]);
}

/* A division list is read up to 255 characters between its brackets; 256
 * are refused as too long, naming the key. The list is
 * [1:4] with its size written with leading zeros to the length wanted. */
static void test_divisions_list_of_255_characters_read_256_refused(void **state)
{
    (void)state;
    char conf[400], list[300];
    memset(list, '0', sizeof list);
    list[0] = '[';
    memcpy(list + 1 + 252, "1:4]", 5); /* 252 zeros, "1:4": 255 characters */
    assert_int_equal(strlen(list), 257);
    snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,roundup_power2_divisions:%s", list);
    static const child_case_t cases[] = {
        {700 * KiB, 768 * KiB}, /* at or below 1 MiB: 4 divisions, step 128 KiB */
        {3000, 3072},           /* step 2048 / 4 = 512 */
    };
    child_rounding(conf, cases, sizeof cases / sizeof cases[0]);
    memset(list, '0', sizeof list);
    list[0] = '[';
    memcpy(list + 1 + 253, "1:4]", 5); /* 256 characters */
    snprintf(conf, sizeof conf, "roundup_power2_divisions:%s", list);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_conf("backend:host,host_mode:virtual");
        CHILD_REQUIRE(tally_configure(conf) == -TALLY_ECONF);
        CHILD_REQUIRE(strcmp(tally_last_error(), "config: roundup_power2_divisions: value too long") == 0);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("a division list of 256 characters was not refused as too long (child status %d)", status);
}

/* host_capacity's units: KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB,
 * TiB (and K, M, G, T) powers of 1024. Each child initialises with one value
 * and reports the device total the backend gives. */
static void test_host_capacity_units_in_children(void **state)
{
    (void)state;
    static const struct {
        const char *value;
        uint64_t total;
    } cases[] = {
        {"3000", 3000},
        {"100KB", 100000},
        {"100MB", 100000000},
        {"3GB", 3000000000},
        {"2TB", 2000000000000},
        {"100KiB", 100 * 1024},
        {"100MiB", 100 * 1048576},
        {"3GiB", 3 * (uint64_t)1073741824},
        {"2TiB", 2 * (uint64_t)1099511627776},
        {"1.5G", 1610612736},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char conf[128];
        snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,host_devices:1,host_capacity:%s",
                 cases[i].value);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            tu_conf(conf);
            size_t free_b = 0, total = 0;
            CHILD_REQUIRE(tally_mem_get_info(0, &free_b, &total) == 0);
            if (total != cases[i].total) {
                fprintf(stderr, "child (%s): total %zu, expected %llu\n", conf, total,
                        (unsigned long long)cases[i].total);
                _exit(1);
            }
            _exit(0);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("child with TALLY_CONF=%s failed: status %d (its message is above)", conf, status);
    }
}

/* An entry of 64 GiB or more sets the last of the 16 slots, the one for
 * every size of 32 GiB and up (as PyTorch clamps its interval index):
 * [1:2,65536:4] rounds 3000 B with 2 divisions, and 33 GiB + 1 and 65 GiB
 * + 1 (past the slot's own interval) with 4. */
static void test_divisions_entry_past_the_last_slot_sets_the_last(void **state)
{
    (void)state;
    static const child_case_t cases[] = {
        {3000, 3072},             /* slot 0 = 2: step 1024 */
        {3 * MiB + 1, 3 * MiB + 512}, /* slot 1 untouched: off */
        {33 * GiB + 1, 40 * GiB}, /* slot 15 = 4: step 8 GiB */
        {65 * GiB + 1, 80 * GiB}, /* still slot 15 (slot 14 is off): step 16 GiB */
    };
    static const unsigned d[16] = {[0] = 2, [15] = 4};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_ctx("request %zu", cases[i].request);
        EQ(tu_round(cases[i].request, d), cases[i].block);
    }
    tu_ctx("%s", "");
    child_rounding("backend:host,host_mode:virtual,host_capacity:128GiB,roundup_power2_divisions:[1:2,65536:4]", cases,
                   sizeof cases / sizeof cases[0]);
}

/* The first list entry also covers every smaller interval, and slots no
 * entry names stay 0 (off): [4:2,16:8] gives slots 0..2 = 2, slot 4 = 8,
 * everything else 0. (Sizes here are the rounded sizes; see blocks below.) */
static void test_divisions_list_first_entry_covers_smaller_sizes(void **state)
{
    (void)state;
    static const child_case_t cases[] = {
        {1200 * KiB, 1536 * KiB},         /* slot 0 = 2: step 512 KiB */
        {3 * MiB + 1, 4 * MiB},           /* slot 1 = 2: step 1 MiB */
        {5 * MiB + 1, 6 * MiB},           /* slot 2 = 2: step 2 MiB */
        {9 * MiB + 1, 9 * MiB + 512},     /* slot 3 untouched: off */
        {17 * MiB + 1, 18 * MiB},         /* slot 4 = 8: step 2 MiB (the segment is 18 MiB too) */
        {33 * MiB + 1, 33 * MiB + 512},   /* slot 5 untouched: off (34 MiB segment, unsplit) */
    };
    static const unsigned d[16] = {2, 2, 2, 0, 8};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_ctx("request %zu", cases[i].request);
        EQ(tu_round(cases[i].request, d), cases[i].block);
    }
    tu_ctx("%s", "");
    static child_case_t blocks[sizeof cases / sizeof cases[0]];
    memcpy(blocks, cases, sizeof cases);
    blocks[5].block = 34 * MiB; /* remainder under 1 MiB: the block is the whole segment */
    child_rounding("backend:host,host_mode:virtual,roundup_power2_divisions:[4:2,16:8]", blocks,
                   sizeof blocks / sizeof blocks[0]);
}

/* ---- divisions: interval list ---------------------------------------------- */

typedef struct round_case {
    size_t request, block;
    int pool;
    size_t segment;
} round_case_t;

static const round_case_t round_cases[] = {
    {2048, 2048, TALLY_POOL_SMALL, 2 * MiB},              /* not above 512 * 4 */
    {2049, 2560, TALLY_POOL_SMALL, 2 * MiB},              /* step 512 */
    {2560, 2560, TALLY_POOL_SMALL, 2 * MiB},              /* on a step: kept */
    {9000, 10240, TALLY_POOL_SMALL, 2 * MiB},             /* step 2048 (plain: 9216) */
    {700 * KiB, 768 * KiB, TALLY_POOL_SMALL, 2 * MiB},    /* step 128 KiB (plain: 700 KiB) */
    {MiB + 1, 1280 * KiB, TALLY_POOL_LARGE, 20 * MiB},    /* step 256 KiB */
    {1200 * KiB, 1280 * KiB, TALLY_POOL_LARGE, 20 * MiB}, /* the notes' example */
    {1280 * KiB, 1280 * KiB, TALLY_POOL_LARGE, 20 * MiB}, /* on a step: kept */
    {3 * MiB + 1, 3 * MiB + 512, TALLY_POOL_LARGE, 20 * MiB}, /* slot 1: off */
    {32 * MiB + 1, 32 * MiB + 512, TALLY_POOL_LARGE, 34 * MiB}, /* slot 5: off */
    {64 * MiB, 64 * MiB, TALLY_POOL_LARGE, 64 * MiB},     /* power of two */
    {65 * MiB, 72 * MiB, TALLY_POOL_LARGE, 72 * MiB},     /* slot 6: step 8 MiB */
    {80 * MiB, 80 * MiB, TALLY_POOL_LARGE, 80 * MiB},     /* on a step: kept */
    {100 * MiB, 104 * MiB, TALLY_POOL_LARGE, 104 * MiB},
    {129 * MiB, 192 * MiB, TALLY_POOL_LARGE, 192 * MiB},  /* slot 7: step 64 MiB */
    {GiB + 1, 1536 * MiB, TALLY_POOL_LARGE, 1536 * MiB},  /* slot 10 */
    {40 * GiB + 1, 48 * GiB, TALLY_POOL_LARGE, 48 * GiB}, /* slot 15 */
};

static void test_divisions_list_rounds_per_interval(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof round_cases / sizeof round_cases[0]; i++) {
        const round_case_t *c = &round_cases[i];
        tu_ctx("request %zu", c->request);
        EQ(tu_round(c->request, divs), c->block);
        tally_stats_t a = tu_stats(0);
        void *p = tu_malloc(c->request, 0, S1);
        assert_non_null(p);
        tally_block_info_t info = tu_info(p);
        EQ(info.size, c->block);
        EQ(info.requested_size, c->request);
        tally_stats_t b = tu_stats(0);
        EQ(b.allocation[c->pool].current - a.allocation[c->pool].current, 1);
        EQ(b.allocated_bytes[c->pool].current - a.allocated_bytes[c->pool].current, c->block);
        EQ(b.reserved_bytes[c->pool].current - a.reserved_bytes[c->pool].current, c->segment);
        CHECK_OK();
        tu_free(p);
        EQ(tally_empty_cache(0), c->segment);
    }
    tu_ctx("%s", "");
}

static void test_write_options_shows_the_effective_config(void **state)
{
    (void)state;
    char *t = tu_options_text();
    HAS(t, "backend:host");
    HAS(t, "host_mode:virtual");
    HAS(t, "max_split_size_mb:40");
    HAS(t, "max_non_split_rounding_mb:20");
    free(t);
    EQ(tu_stats(0).max_split_size, 40 * MiB);
    tu_buf_t b = {0};
    assert_int_equal(tally_write_stats_json(0, tu_buf_write, &b), 0);
    HAS(b.p, "\"max_split_size\": 41943040");
    tu_buf_free(&b);
}

/* ---- runtime configuration -------------------------------------------------- */

static void test_memory_fraction_key_applies_at_runtime(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("memory_fraction:0.5"), 0);
    char *t = tu_options_text();
    HAS(t, "memory_fraction:0.5");
    free(t);
    void *a = tu_malloc(32 * GiB, 0, S1); /* powers of two: not rounded up */
    void *b8 = tu_malloc(8 * GiB, 0, S1); /* exactly the 40 GiB limit */
    assert_non_null(a);
    assert_non_null(b8);
    cap_begin();
    assert_null(tu_malloc(2 * MiB, 0, S1));
    cap_end();
    HAS(tally_last_error(), "memory fraction");
    tu_free(a);
    tu_free(b8);
    assert_int_equal(tally_configure("memory_fraction:1"), 0);
    void *b = tu_malloc(60 * GiB, 0, S2);
    assert_non_null(b);
    tu_free(b);
    CHECK_OK();
}

/* docs/configuration.md: memory_fraction "caps every device's reserved
 * memory at f x its capacity". Setting the key must do that even when a
 * per-device tally_set_memory_fraction changed a device in between. */
static void test_memory_fraction_key_reapplies_to_every_device(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("memory_fraction:0.5"), 0);
    assert_int_equal(tally_set_memory_fraction(1.0, 0), 0); /* device 0 uncapped */
    assert_int_equal(tally_configure("memory_fraction:0.5"), 0);
    cap_begin();
    void *p = tu_malloc(48 * GiB, 0, S1); /* over the 40 GiB cap */
    cap_end();
    assert_int_equal(tally_configure("memory_fraction:1"), 0);
    if (p)
        fail_msg("48 GiB allocated after memory_fraction:0.5 was set (cap not applied)");
}

/* tally__parse_size, the reader of every size key, directly: a size is a
 * whole number of bytes below 2^64. 2^64 (written as 16777216TiB or in
 * digits) and more are refused, where a conversion to uint64_t would wrap
 * (x86-64 gives 0, aarch64 saturates). */
static void test_parse_size_refuses_2_to_the_64_and_more(void **state)
{
    (void)state;
    static const char *const bad[] = {"16777216TiB", "18446744073709551616", "18446744073709551615",
                                      "1e30", "1e300", "16384PiB", "0.5", "-1", "+1", "", "12 MiB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 12345;
        if (tally__parse_size(bad[i], &v))
            fail_msg("'%s' read as a size (%llu)", bad[i], (unsigned long long)v);
        assert_true(v == 12345);
    }
    static const struct {
        const char *text;
        uint64_t v;
    } good[] = {{"16777215TiB", (uint64_t)16777215 << 40}, {"9007199254740992", (uint64_t)1 << 53},
                {"1.5KiB", 1536}, {"0", 0}, {"2GB", 2000000000}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 0;
        if (!tally__parse_size(good[i].text, &v) || v != good[i].v)
            fail_msg("'%s' read as %llu, expected %llu", good[i].text, (unsigned long long)v,
                     (unsigned long long)good[i].v);
    }
}

int main(void)
{
    tu_conf(CONF_MAIN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divisions_single_number_in_a_child),
        cmocka_unit_test(test_divisions_list_of_255_characters_read_256_refused), /* first: fork before init */
        cmocka_unit_test(test_host_capacity_units_in_children), /* also before init */
        cmocka_unit_test(test_parse_size_refuses_2_to_the_64_and_more),
        cmocka_unit_test(test_divisions_list_first_entry_covers_smaller_sizes),
        cmocka_unit_test(test_divisions_entry_past_the_last_slot_sets_the_last),
        cmocka_unit_test_setup(test_divisions_list_rounds_per_interval, tu_setup_clean),
        cmocka_unit_test_setup(test_write_options_shows_the_effective_config, tu_setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_key_applies_at_runtime, tu_setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_key_reapplies_to_every_device, tu_setup_clean),
    };
    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
