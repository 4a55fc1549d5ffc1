/* Configuration that changes the caching rules: roundup_power2_divisions
 * (single number and interval list) and max_split_size_mb (oversize blocks,
 * the reuse allowance, release_available_cached_blocks), plus runtime keys.
 *
 * This process runs with
 *   max_split_size_mb:40, roundup_power2_divisions:[1:4,2:0,64:8,>:2]
 * which by the notes' rule gives the divisions table
 *   slot 0 (< 2 MiB) 4, slots 1..5 (2..64 MiB) 0, slot 6 (64..128 MiB) 8,
 *   slots 7..15 (>= 128 MiB) 2.
 * Expected sizes below are worked out by hand from notes §6; tu_round (the
 * test's own implementation of the rule) is checked against them too. */
#include "testutil.h"

#include "core/internal.h" /* tally__parse_size */

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define S1 STREAM(1)
#define S2 STREAM(2)

#define CONF_MAIN                                                                                                  \
    "backend:host,host_devices:1,host_capacity:80GiB,host_mode:virtual,max_split_size_mb:40,"                      \
    "roundup_power2_divisions:[1:4,2:0,64:8,>:2]"

static const unsigned divs[16] = {4, 0, 0, 0, 0, 0, 8, 2, 2, 2, 2, 2, 2, 2, 2, 2};

/* 100 MiB of the 80 GiB device: 5/4096, exact in binary. */
#define FRACTION_100MiB 0.001220703125

static int setup_clean(void **state)
{
    (void)state;
    tu_reset();
    return 0;
}

/* ---- divisions: single number, in a child with its own TALLY_CONF -------- */

#define CHILD_REQUIRE(c)                                                                                           \
    do {                                                                                                           \
        if (!(c)) {                                                                                                \
            fprintf(stderr, "child: %s:%d: %s failed (%s)\n", __FILE__, __LINE__, #c, tally_last_error());        \
            _exit(1);                                                                                              \
        }                                                                                                          \
    } while (0)

static size_t child_block_size(size_t request)
{
    void *p = tu_malloc(request, 0, NULL);
    CHILD_REQUIRE(p != NULL);
    tally_block_info_t i;
    CHILD_REQUIRE(tally_block_info(p, &i) == 0);
    tu_free(p);
    return i.size;
}

typedef struct child_case {
    size_t request, block;
} child_case_t;

/* Fork a child that initialises with conf and checks each block size. */
static void child_rounding(const char *conf, const child_case_t *cases, size_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_conf(conf);
        CHILD_REQUIRE(tally_init() == 0);
        for (size_t i = 0; i < n; i++) {
            size_t got = child_block_size(cases[i].request);
            if (got != cases[i].block) {
                fprintf(stderr, "child (%s): request %zu gave a block of %zu, expected %zu\n", conf,
                        cases[i].request, got, cases[i].block);
                _exit(1);
            }
        }
        CHILD_REQUIRE(tally_check() == 0);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child with TALLY_CONF=%s failed: status %d (its message is above)", conf, status);
}

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

/* max_split_size_mb with expandable segments: a stream's region is one
 * free block far above any max_split_size, yet its pieces are never
 * oversize (PyTorch's expandable segments split them as any other), so a
 * request under the limit and one over it are both served from it. */
static void test_max_split_size_leaves_expandable_blocks_alone_in_a_child(void **state)
{
    (void)state;
    static const child_case_t cases[] = {
        {3 * MiB, 3 * MiB},
        {30 * MiB, 30 * MiB},
        {21 * MiB + 1, 21 * MiB + 512},
    };
    child_rounding("backend:host,host_mode:virtual,host_capacity:8GiB,expandable_segments:true,max_split_size_mb:20",
                   cases, sizeof cases / sizeof cases[0]);
}

/* max_split_size_mb with a 100 MiB large segment (large_segment_size_mb): an
 * 8 MiB block is split from it (under the limit), leaving a free tail of
 * 92 MiB, far above the limit but part of a segment with a live block. A
 * request that does not fit under the capacity makes the allocator release
 * oversize cached blocks first (release_available_cached_blocks): only whole
 * free segments may go, so the tail stays, the request fails as out of
 * memory, and the live block, its segment and the cache stay intact. */
static void test_oversize_release_leaves_a_split_segment_alone_in_a_child(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_buf_t diag = {0};
        tally_set_sink(tu_buf_write, &diag); /* the out-of-memory report is expected */
        tu_conf("backend:host,host_mode:virtual,host_devices:1,host_capacity:200MiB,max_split_size_mb:40,"
                "large_segment_size_mb:100,leak_report:off");
        CHILD_REQUIRE(tally_init() == 0);
        void *a = tu_malloc(8 * MiB, 0, NULL);
        CHILD_REQUIRE(a != NULL);
        tally_stats_t s0;
        CHILD_REQUIRE(tally_get_stats(0, &s0) == 0);
        CHILD_REQUIRE(s0.reserved_bytes[0].current == 100 * MiB && s0.inactive_split_bytes[0].current == 92 * MiB);
        void *big = tally_malloc(150 * MiB, 0, NULL); /* 100 + 150 > 200 */
        CHILD_REQUIRE(big == NULL);
        tally_stats_t s1;
        CHILD_REQUIRE(tally_get_stats(0, &s1) == 0);
        CHILD_REQUIRE(s1.num_device_free == s0.num_device_free);
        CHILD_REQUIRE(s1.reserved_bytes[0].current == 100 * MiB && s1.segment[0].current == 1);
        CHILD_REQUIRE(s1.num_ooms - s0.num_ooms == 1);
        CHILD_REQUIRE(tally_check() == 0);
        tally_block_info_t i;
        CHILD_REQUIRE(tally_block_info(a, &i) == 0 && i.size == 8 * MiB);
        /* The tail still serves a request of its size class. */
        void *c = tu_malloc(80 * MiB, 0, NULL);
        CHILD_REQUIRE(c == (char *)a + 8 * MiB);
        tu_free(c);
        tu_free(a);
        CHILD_REQUIRE(tally_check() == 0);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child failed: status %d (its message is above)", status);
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
 * [1:2,65536:4] rounds 3000 B with 2 divisions and 33 GiB + 1 with 4. */
static void test_divisions_entry_past_the_last_slot_sets_the_last(void **state)
{
    (void)state;
    static const child_case_t cases[] = {
        {3000, 3072},             /* slot 0 = 2: step 1024 */
        {3 * MiB + 1, 3 * MiB + 512}, /* slot 1 untouched: off */
        {33 * GiB + 1, 40 * GiB}, /* slot 15 = 4: step 8 GiB */
    };
    static const unsigned d[16] = {[0] = 2, [15] = 4};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_ctx("request %zu", cases[i].request);
        EQ(tu_round(cases[i].request, d), cases[i].block);
    }
    tu_ctx("%s", "");
    child_rounding("backend:host,host_mode:virtual,roundup_power2_divisions:[1:2,65536:4]", cases,
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

/* ---- max_split_size_mb:40 -------------------------------------------------- */

static void test_oversize_block_not_split_and_counted(void **state)
{
    (void)state;
    int64_t freed0 = tu_stats(0).oversize_allocations.freed;
    void *a = tu_malloc(50 * MiB, 0, S1);
    tally_stats_t s = tu_stats(0);
    EQ(tu_info(a).size, 50 * MiB);
    EQ(s.oversize_allocations.current, 1);
    EQ(s.oversize_segments.current, 1);
    EQ(s.inactive_split[0].current, 0);
    tu_free(a);
    s = tu_stats(0);
    EQ(s.oversize_allocations.current, 0);
    EQ(s.oversize_allocations.freed - freed0, 1);
    EQ(s.oversize_segments.current, 1); /* still cached */

    /* 39.5 MiB: below the limit, but its 40 MiB segment is at it; the
     * remainder (0.5 MiB) is too small to split, so the block is 40 MiB and
     * counts as an oversize allocation. */
    void *b = tu_malloc(39 * MiB + 512 * KiB, 0, S1);
    EQ(tu_info(b).size, 40 * MiB);
    s = tu_stats(0);
    EQ(s.oversize_allocations.current, 1);
    EQ(s.oversize_segments.current, 2);
    tu_free(b);

    /* 38.5 MiB: a 40 MiB (oversize) segment that is split. */
    void *c = tu_malloc(38 * MiB + 512 * KiB, 0, S2);
    EQ(tu_info(c).size, 38 * MiB + 512 * KiB);
    s = tu_stats(0);
    EQ(s.oversize_allocations.current, 0);
    EQ(s.oversize_segments.current, 3);
    EQ(s.inactive_split_bytes[TALLY_POOL_LARGE].current, 1536 * KiB);
    tu_free(c);
    EQ(tu_stats(0).oversize_segments.current, 3);
    CHECK_OK();
    EQ(tally_empty_cache(0), 130 * MiB);
    EQ(tu_stats(0).oversize_segments.current, 0);
}

static void test_cached_oversize_block_not_used_for_smaller_request(void **state)
{
    (void)state;
    void *a = tu_malloc(50 * MiB, 0, S1);
    tu_free(a);
    int64_t allocs = tu_stats(0).num_device_alloc;
    void *b = tu_malloc(30 * MiB, 0, S1); /* below max_split: never an oversize block */
    assert_ptr_not_equal(b, a);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    void *c = tu_malloc(2 * MiB, 0, S1);
    assert_true((uintptr_t)c < (uintptr_t)a || (uintptr_t)c >= (uintptr_t)a + 50 * MiB);
    EQ(tu_stats(0).num_device_alloc - allocs, 2);
    /* A request at or above max_split takes it. */
    void *d = tu_malloc(40 * MiB, 0, S1);
    assert_ptr_equal(d, a);
    EQ(tu_info(d).size, 50 * MiB);
    EQ(tu_stats(0).num_device_alloc - allocs, 2);
    tu_free(b);
    tu_free(c);
    tu_free(d);
    CHECK_OK();
}

/* The limit itself is oversize: a cached free block of exactly 40 MiB is not
 * used for a 30 MiB request (and so never split); a 40 MiB request takes it. */
static void test_block_of_exactly_max_split_is_oversize(void **state)
{
    (void)state;
    void *a = tu_malloc(40 * MiB, 0, S2);
    EQ(tu_info(a).size, 40 * MiB);
    EQ(tu_stats(0).oversize_allocations.current, 1);
    tu_free(a);
    int64_t allocs = tu_stats(0).num_device_alloc;
    void *b = tu_malloc(30 * MiB, 0, S2);
    assert_ptr_not_equal(b, a);
    EQ(tu_info(b).size, 30 * MiB);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    EQ(tu_stats(0).inactive_split[0].current, 0);
    void *c = tu_malloc(40 * MiB, 0, S2);
    assert_ptr_equal(c, a);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

/* A cached oversize block serves a request at most
 * max_non_split_rounding (20 MiB) smaller than itself, whole. */
static void test_oversize_reuse_allowance_is_20MiB(void **state)
{
    (void)state;
    void *a = tu_malloc(62 * MiB, 0, S1);
    tu_free(a);
    int64_t allocs = tu_stats(0).num_device_alloc;
    void *b = tu_malloc(42 * MiB, 0, S1); /* 62 >= 42 + 20: not reused */
    assert_ptr_not_equal(b, a);
    EQ(tu_stats(0).num_device_alloc - allocs, 1);
    void *c = tu_malloc(42 * MiB + 1, 0, S1); /* 62 < 42 MiB + 512 + 20: reused whole */
    assert_ptr_equal(c, a);
    EQ(tu_info(c).size, 62 * MiB);
    EQ(tu_info(c).requested_size, 42 * MiB + 1);
    tally_stats_t s = tu_stats(0);
    EQ(s.num_device_alloc - allocs, 1);
    EQ(s.inactive_split[0].current, 0);
    EQ(s.allocated_bytes[0].current, 104 * MiB);
    EQ(s.requested_bytes[0].current, 84 * MiB + 1);
    EQ(s.oversize_allocations.current, 2);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

/* Under a 100 MiB fraction: a failed allocation first frees one cached
 * oversize block big enough (no sync, no retry counted). */
static void test_release_available_frees_one_oversize_block(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(50 * MiB, 0, S1);
    tu_free(a);
    void *b = tu_malloc(30 * MiB, 0, S1);
    tally_stats_t s0 = tu_stats(0);
    EQ(s0.reserved_bytes[0].current, 80 * MiB);
    void *c = tu_malloc(30 * MiB, 0, S1); /* 80 + 30 > 100 */
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 1);
    EQ(s1.num_device_alloc - s0.num_device_alloc, 1);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 0);
    EQ(s1.num_ooms - s0.num_ooms, 0);
    EQ(s1.reserved_bytes[0].current, 60 * MiB);
    EQ(s1.oversize_segments.current, 0);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
}

static void test_release_available_frees_several_largest_blocks(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(42 * MiB, 0, S1);
    void *b = tu_malloc(44 * MiB, 0, S1);
    tu_free(a);
    tu_free(b);
    tally_stats_t s0 = tu_stats(0);
    void *c = tu_malloc(60 * MiB, 0, S1); /* 86 + 60 > 100; no single block is 60: both go */
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 2);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 0);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 0);
    EQ(s1.reserved_bytes[0].current, 60 * MiB);
    tu_free(c);
    CHECK_OK();
}

/* Not enough oversize blocks: they are released anyway, then the full
 * release_cached_blocks (sync) and the counted retry, then the OOM. */
static void test_release_available_not_enough_then_oom(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    void *a = tu_malloc(44 * MiB, 0, S1);
    void *live = tu_malloc(50 * MiB, 0, S1);
    tu_free(a);
    tally_stats_t s0 = tu_stats(0);
    cap_begin();
    void *c = tu_malloc(60 * MiB, 0, S1); /* 94 + 60 > 100, and 50 + 60 still is */
    cap_end();
    assert_null(c);
    tally_stats_t s1 = tu_stats(0);
    EQ(s1.num_device_free - s0.num_device_free, 1);
    EQ(s1.num_sync_all_streams - s0.num_sync_all_streams, 1);
    EQ(s1.num_alloc_retries - s0.num_alloc_retries, 1);
    EQ(s1.num_ooms - s0.num_ooms, 1);
    EQ(s1.reserved_bytes[0].current, 50 * MiB);
    HAS(tally_last_error(), "out of memory");
    HAS(cap_text(), "out of memory");
    tu_free(live);
    CHECK_OK();
}

/* Oversize blocks cached on another stream are not candidates; the full
 * release path frees them. */
/* What the full release path leaves in the statistics between s0 and s1:
 * one segment freed, one sync of all streams, one counted retry, no OOM. */
static void expect_full_release(const tally_stats_t *s0, const tally_stats_t *s1)
{
    EQ(s1->num_device_free - s0->num_device_free, 1);
    EQ(s1->num_sync_all_streams - s0->num_sync_all_streams, 1);
    EQ(s1->num_alloc_retries - s0->num_alloc_retries, 1);
    EQ(s1->num_ooms - s0->num_ooms, 0);
}

/* A cached oversize block on cached_on; 30 MiB twice on asked_on under the
 * 100 MiB cap: the second needs the block released, which only the full
 * release does (release_available_cached_blocks keeps to the stream). */
static void other_stream_case(void *cached_on, void *asked_on)
{
    tu_free(tu_malloc(50 * MiB, 0, cached_on));
    void *b = tu_malloc(30 * MiB, 0, asked_on);
    tally_stats_t s0 = tu_stats(0);
    void *c = tu_malloc(30 * MiB, 0, asked_on);
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    expect_full_release(&s0, &s1);
    tu_free(b);
    tu_free(c);
    CHECK_OK();
    tally_empty_cache(0);
}

static void test_release_available_ignores_other_streams(void **state)
{
    (void)state;
    assert_int_equal(tally_set_memory_fraction(FRACTION_100MiB, 0), 0);
    other_stream_case(S2, S1);
    /* The other way round: the cached block's stream orders before the
     * request's, where the search for the largest blocks starts. */
    other_stream_case(S1, S2);
}

/* Releasing oversize blocks that together fall short is not a success: the
 * allocation goes on to the full release (sync) and the counted retry even
 * though, after an injected OOM, the backend would now have room. */
static void test_release_available_short_goes_on_to_full_release(void **state)
{
    (void)state;
    tu_free(tu_malloc(50 * MiB, 0, S1));
    tally_stats_t s0 = tu_stats(0);
    assert_int_equal(tally_host_fail_alloc(1, 0), 0);
    void *c = tu_malloc(60 * MiB, 0, S1); /* no 60 MiB block; 50 is not enough */
    assert_non_null(c);
    tally_stats_t s1 = tu_stats(0);
    expect_full_release(&s0, &s1);
    tu_free(c);
    CHECK_OK();
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
        cmocka_unit_test(test_max_split_size_leaves_expandable_blocks_alone_in_a_child),
        cmocka_unit_test(test_oversize_release_leaves_a_split_segment_alone_in_a_child), /* before init */
        cmocka_unit_test(test_divisions_list_first_entry_covers_smaller_sizes),
        cmocka_unit_test(test_divisions_entry_past_the_last_slot_sets_the_last),
        cmocka_unit_test_setup(test_divisions_list_rounds_per_interval, setup_clean),
        cmocka_unit_test_setup(test_write_options_shows_the_effective_config, setup_clean),
        cmocka_unit_test_setup(test_oversize_block_not_split_and_counted, setup_clean),
        cmocka_unit_test_setup(test_cached_oversize_block_not_used_for_smaller_request, setup_clean),
        cmocka_unit_test_setup(test_block_of_exactly_max_split_is_oversize, setup_clean),
        cmocka_unit_test_setup(test_oversize_reuse_allowance_is_20MiB, setup_clean),
        cmocka_unit_test_setup(test_release_available_frees_one_oversize_block, setup_clean),
        cmocka_unit_test_setup(test_release_available_frees_several_largest_blocks, setup_clean),
        cmocka_unit_test_setup(test_release_available_not_enough_then_oom, setup_clean),
        cmocka_unit_test_setup(test_release_available_ignores_other_streams, setup_clean),
        cmocka_unit_test_setup(test_release_available_short_goes_on_to_full_release, setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_key_applies_at_runtime, setup_clean),
        cmocka_unit_test_setup(test_memory_fraction_key_reapplies_to_every_device, setup_clean),
    };
    return cmocka_run_group_tests_name("options", tests, NULL, NULL);
}
