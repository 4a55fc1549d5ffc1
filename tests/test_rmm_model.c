/* Tests for the model of RAPIDS RMM's pool_memory_resource (tools/rmm_pool.c,
 * compiled in; bench's rmm-pool-model): each of its rules on a hand-made
 * trace whose outcome is worked out in the comments, from the RMM source
 * that rule cites, and the settings RMM refuses. Addresses are offsets from
 * the first upstream allocation (2^40 in the model). */
#include "../bench/trace.c"
#include "../tools/rmm_pool.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define BASE ((uint64_t)1 << 40)

typedef struct hev {
    char op;
    uint64_t id, size, stream;
} hev_t;

static void make(trace_t *t, const hev_t *ev, size_t n)
{
    char err[256];
    trace_builder_t b;
    assert_int_equal(trace_begin(&b, t, "hand", err, sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        if (trace_add(&b, ev[i].op, ev[i].id, ev[i].size, ev[i].stream, err, sizeof err))
            fail_msg("event %zu: %s", i, err);
    trace_end(&b);
}

/* Replays n events with o; where gets offsets from BASE. */
static rmm_result_t replay(const hev_t *ev, size_t n, rmm_opts_t o, uint64_t *where)
{
    trace_t t;
    make(&t, ev, n);
    rmm_result_t r;
    char err[256];
    uint64_t addr[64] = {0};
    assert_true(t.nalloc <= 64);
    if (rmm_replay(&t, &o, &r, addr, err, sizeof err))
        fail_msg("replay: %s", err);
    for (size_t i = 0; where && i < t.nalloc; i++)
        where[i] = addr[i] ? addr[i] - BASE : UINT64_MAX;
    trace_free(&t);
    return r;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Rules 1 and 4: a fixed pool of 4 KiB. a (256) at 0, b (300 -> 512) at
 * 256, c (256) at 768, d (256) at 1024. a and c freed: the free list holds
 * [0,256), [768,1024) and [1280,4096). A request of 200 (256) takes the
 * lowest of the two 256-byte blocks (0), not the first large enough by
 * size order of the rest; then one of 100 (256) takes 768; then 1 byte
 * (256) comes from the front of the big block, 1280. */
static void test_rounding_and_best_fit_lowest_address(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 256, 0}, {'a', 2, 300, 0}, {'a', 3, 256, 0}, {'a', 4, 256, 0},
                               {'f', 1, 256, 0}, {'f', 3, 256, 0}, {'a', 5, 200, 0}, {'a', 6, 100, 0},
                               {'a', 7, 1, 0}};
    uint64_t w[7];
    rmm_result_t r = replay(ev, N(ev), (rmm_opts_t){4 * KiB, 4 * KiB, 80 * MiB}, w);
    assert_int_equal(r.oom_event, -1);
    assert_int_equal(w[0], 0);
    assert_int_equal(w[1], 256);
    assert_int_equal(w[2], 768);
    assert_int_equal(w[3], 1024);
    assert_int_equal(w[4], 0);
    assert_int_equal(w[5], 768);
    assert_int_equal(w[6], 1280);
    assert_int_equal(r.upstream_allocs, 1);
    assert_int_equal(r.peak_reserved, 4 * KiB);
    assert_int_equal(r.event_records, 2);
}

/* Rule 3: freeing b between free a and free c merges all three: a request
 * of 1 KiB then fits at 0 in a pool of 1 KiB (a, b, c: 256 + 512 + 256). */
static void test_a_free_merges_with_both_neighbours(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 256, 0}, {'a', 2, 512, 0}, {'a', 3, 256, 0}, {'f', 1, 256, 0},
                               {'f', 3, 256, 0}, {'f', 2, 512, 0}, {'a', 4, 1024, 0}};
    uint64_t w[4];
    rmm_result_t r = replay(ev, N(ev), (rmm_opts_t){KiB, KiB, 80 * MiB}, w);
    assert_int_equal(r.oom_event, -1);
    assert_int_equal(w[3], 0);
}

/* Rules 3 and 6: with no initial pool, 2 MiB then 2 MiB (the first live)
 * grow the pool by max(2 MiB, 2 MiB): two upstream allocations that touch
 * (2^40 and 2^40 + 2 MiB). Both freed, a 4 MiB request does not merge them
 * (the second begins an upstream allocation) and grows by max(4, 4) MiB. */
static void test_no_merge_across_upstream_allocations(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 2 * MiB, 0}, {'a', 2, 2 * MiB, 0}, {'f', 1, 2 * MiB, 0},
                               {'f', 2, 2 * MiB, 0}, {'a', 3, 4 * MiB, 0}};
    uint64_t w[3];
    rmm_result_t r = replay(ev, N(ev), (rmm_opts_t){0, 0, 80 * MiB}, w);
    assert_int_equal(w[0], 0);
    assert_int_equal(w[1], 2 * MiB); /* they touch */
    assert_int_equal(w[2], 4 * MiB);
    assert_int_equal(r.upstream_allocs, 3);
    assert_int_equal(r.peak_reserved, 8 * MiB);
}

/* Rule 6, no maximum: each growth asks for max(size, pool size); a refused
 * request is halved. A 10 MiB device: 4 MiB (pool 4), 4 MiB (max(4, 4):
 * pool 8), 1 MiB asks max(1, 8) = 8 (refused), 4 (refused), 2 (fits: 10).
 * A fourth request, of 3 MiB, finds only the 1 MiB left of that growth and
 * asks 10, 5, then 3: all refused, so the pool runs out at event 3. */
static void test_growth_doubles_and_halves_when_refused(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 4 * MiB, 0}, {'a', 2, 4 * MiB, 0}, {'a', 3, MiB, 0}, {'a', 4, 3 * MiB, 0}};
    uint64_t w[4];
    rmm_result_t r = replay(ev, N(ev), (rmm_opts_t){0, 0, 10 * MiB}, w);
    assert_int_equal(r.peak_reserved, 10 * MiB);
    assert_int_equal(r.upstream_allocs, 3);
    assert_int_equal(r.upstream_failed, 2 + 3);
    assert_int_equal(r.oom_event, 3);
    assert_int_equal(w[2], 8 * MiB);
}

/* Rule 6, with a maximum of 16 MiB: the first growth for 1 MiB asks
 * max(1, 16/2) = 8 MiB; the next, with 8 MiB left, max(9, 4) = 9 would pass
 * the room left (8): refused outright; 8 MiB asks max(8, 8/2) = 8. */
static void test_growth_under_a_maximum(void **state)
{
    (void)state;
    static const hev_t ev1[] = {{'a', 1, MiB, 0}};
    rmm_result_t r = replay(ev1, N(ev1), (rmm_opts_t){0, 16 * MiB, 80 * MiB}, NULL);
    assert_int_equal(r.peak_reserved, 8 * MiB);
    static const hev_t ev2[] = {{'a', 1, 8 * MiB, 0}, {'a', 2, 9 * MiB, 0}};
    r = replay(ev2, N(ev2), (rmm_opts_t){0, 16 * MiB, 80 * MiB}, NULL);
    assert_int_equal(r.oom_event, 1);
    assert_int_equal(r.upstream_failed, 0); /* no request made: size_to_grow gave 0 */
    static const hev_t ev3[] = {{'a', 1, 8 * MiB, 0}, {'a', 2, 8 * MiB, 0}};
    r = replay(ev3, N(ev3), (rmm_opts_t){0, 16 * MiB, 80 * MiB}, NULL);
    assert_int_equal(r.oom_event, -1);
    assert_int_equal(r.peak_reserved, 16 * MiB);
}

/* Rule 5: a block freed on stream 1 serves stream 2 with one wait, and the
 * rest stays in stream 1's list (stream 1 then takes it with no wait). In a
 * fixed pool of 4 MiB, two pieces freed on streams 3 and 4 that touch serve
 * a request for both on stream 5 only once the lists are merged into
 * stream 5's, with no growth. */
static void test_other_streams_blocks_and_merged_lists(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 4 * MiB, 1}, {'f', 1, 4 * MiB, 1}, {'a', 2, MiB, 2}, {'a', 3, 3 * MiB, 1}};
    uint64_t w[4];
    rmm_result_t r = replay(ev, N(ev), (rmm_opts_t){0, 0, 80 * MiB}, w);
    assert_int_equal(r.stream_waits, 1);
    assert_int_equal(r.upstream_allocs, 1);
    assert_int_equal(w[1], 0);
    assert_int_equal(w[2], MiB);
    assert_int_equal(r.streams, 2);
    static const hev_t ev2[] = {{'a', 1, MiB, 3}, {'a', 2, MiB, 4}, {'a', 9, 2 * MiB, 3}, {'f', 1, MiB, 3},
                                {'f', 2, MiB, 4}, {'a', 3, 2 * MiB, 5}};
    r = replay(ev2, N(ev2), (rmm_opts_t){4 * MiB, 4 * MiB, 80 * MiB}, w);
    assert_int_equal(r.oom_event, -1);
    assert_int_equal(w[3], 0);
    /* Three waits for the blocks taken from the initial pool's list (the
     * legacy stream's) before; then three merges: that list, empty now, then
     * stream 3's and stream 4's, whose pieces touch. */
    assert_int_equal(r.stream_waits, 3 + 3);
    assert_int_equal(r.streams, 4);
    assert_int_equal(r.upstream_allocs, 1);
}

/* Rule 1: size 0 allocates and frees nothing (no event recorded). */
static void test_size_zero_is_nothing(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 0, 0}, {'a', 2, 256, 0}, {'f', 1, 0, 0}, {'f', 2, 256, 0}};
    rmm_result_t r = replay(ev, N(ev), (rmm_opts_t){0, 0, 80 * MiB}, NULL);
    assert_int_equal(r.event_records, 1);
    assert_int_equal(r.upstream_allocs, 1);
    assert_int_equal(r.peak_reserved, 256);
}

/* The least pool: 1 MiB a, 1 MiB b, a freed, 2 MiB c. A pool of 3 MiB (the
 * peak live bytes) leaves c no room (the free piece at 0 is 1 MiB); 4 MiB
 * serves it. */
static void test_least_pool(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, MiB, 0}, {'a', 2, MiB, 0}, {'f', 1, MiB, 0}, {'a', 3, 2 * MiB, 0}};
    trace_t t;
    make(&t, ev, N(ev));
    char err[256];
    assert_int_equal(rmm_least_pool(&t, MiB, 80 * MiB, err, sizeof err), 4 * MiB);
    assert_int_equal(rmm_least_pool(&t, MiB, 3 * MiB, err, sizeof err), 0);
    assert_non_null(strstr(err, "no pool up to the device's 3145728 bytes serves the trace"));
    trace_free(&t);
}

/* The settings RMM refuses, each named. */
static void test_refused_settings(void **state)
{
    (void)state;
    static const hev_t ev[] = {{'a', 1, 256, 0}};
    trace_t t;
    make(&t, ev, N(ev));
    rmm_result_t r;
    char err[256];
    assert_int_equal(rmm_replay(&t, &(rmm_opts_t){100, 0, 80 * MiB}, &r, NULL, err, sizeof err), -1);
    assert_string_equal(err, "RMM pool: the initial (100) and maximum (0) pool sizes must be multiples of 256 bytes");
    assert_int_equal(rmm_replay(&t, &(rmm_opts_t){2 * MiB, MiB, 80 * MiB}, &r, NULL, err, sizeof err), -1);
    assert_string_equal(err, "RMM pool: the initial pool size (2097152) exceeds the maximum (1048576)");
    assert_int_equal(rmm_replay(&t, &(rmm_opts_t){4 * MiB, 0, 2 * MiB}, &r, NULL, err, sizeof err), -1);
    assert_string_equal(err, "RMM pool: an initial pool of 4194304 bytes does not fit in the device's 2097152");
    trace_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding_and_best_fit_lowest_address),
        cmocka_unit_test(test_a_free_merges_with_both_neighbours),
        cmocka_unit_test(test_no_merge_across_upstream_allocations),
        cmocka_unit_test(test_growth_doubles_and_halves_when_refused),
        cmocka_unit_test(test_growth_under_a_maximum),
        cmocka_unit_test(test_other_streams_blocks_and_merged_lists),
        cmocka_unit_test(test_size_zero_is_nothing),
        cmocka_unit_test(test_least_pool),
        cmocka_unit_test(test_refused_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
