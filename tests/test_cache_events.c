/* record_stream and stream events (notes §2): a block used on another stream
 * is freed by the user at once (allocation stats drop) but stays active,
 * and is not reused, until the events recorded at its free have completed
 * AND a later malloc on its device (or empty_cache / the OOM path) has
 * processed them.
 *
 * The host backend models a busy stream with tally_host_stream_hold: events
 * recorded on a held stream stay pending until it is released. */
#include "testutil.h"

#define S1 STREAM(1) /* allocation stream */
#define S2 STREAM(2) /* held in most tests */
#define S3 STREAM(3)
#define S4 STREAM(4) /* never held */

static int setup_clean(void **state)
{
    (void)state;
    tu_reset();
    return 0;
}

static void expect_counts(int dev, int64_t allocations, int64_t active, int64_t active_bytes, int64_t requested)
{
    tally_stats_t s = tu_stats(dev);
    EQ(s.allocation[0].current, allocations);
    EQ(s.active[0].current, active);
    EQ(s.active_bytes[0].current, active_bytes);
    EQ(s.requested_bytes[0].current, requested);
    CHECK_OK();
}

static void test_pending_block_stays_active_until_events_processed(void **state)
{
    (void)state;
    void *p = tu_malloc(4000, 0, S1);
    assert_int_equal(tally_record_stream(p, S2), 0);
    assert_int_equal(tally_host_stream_hold(S2, 1), 0);
    tu_free(p);
    /* Freed for the user: allocation and allocated_bytes drop now. */
    tally_stats_t s = tu_stats(0);
    EQ(s.allocation[0].current, 0);
    EQ(s.allocated_bytes[0].current, 0);
    EQ(s.allocation[0].freed, s.allocation[0].allocated);
    expect_counts(0, 0, 1, 4096, 4000);
    tally_block_info_t info;
    assert_true(tally_block_info(p, &info) < 0);

    /* Not reused while its event is pending. */
    void *q = tu_malloc(4000, 0, S1);
    assert_ptr_not_equal(q, p);
    EQ((uintptr_t)q, (uintptr_t)p + 4096);
    expect_counts(0, 1, 2, 8192, 8000);

    /* Releasing the stream completes the event, but nothing looks until
     * the next malloc. */
    assert_int_equal(tally_host_stream_hold(S2, 0), 0);
    expect_counts(0, 1, 2, 8192, 8000);

    void *r = tu_malloc(4000, 0, S1); /* processes the event first: p is free and fits best */
    assert_ptr_equal(r, p);
    expect_counts(0, 2, 2, 8192, 8000);
    tu_free(q);
    tu_free(r);
    expect_counts(0, 0, 0, 0, 0);
    EQ(tu_stats(0).inactive_split[0].current, 0);
}

static void test_block_waits_for_every_recorded_stream(void **state)
{
    (void)state;
    void *p = tu_malloc(12 * MiB, 0, S1);
    tally_host_stream_hold(S2, 1);
    tally_host_stream_hold(S3, 1);
    assert_int_equal(tally_record_stream(p, S2), 0);
    assert_int_equal(tally_record_stream(p, S3), 0);
    assert_int_equal(tally_record_stream(p, S3), 0); /* duplicates collapse */
    assert_int_equal(tally_record_stream(p, S1), 0); /* its own stream: no-op */
    tu_free(p);
    expect_counts(0, 0, 1, 12 * MiB, 12 * MiB);

    tally_host_stream_hold(S2, 0);
    void *x = tu_malloc(512, 0, S1);
    expect_counts(0, 1, 2, 12 * MiB + 512, 12 * MiB + 512); /* S3 still busy */
    void *q = tu_malloc(12 * MiB, 0, S1);
    assert_ptr_not_equal(q, p);
    tu_free(q);

    tally_host_stream_hold(S3, 0);
    void *y = tu_malloc(512, 0, S1);
    expect_counts(0, 2, 2, 1024, 1024);
    void *r = tu_malloc(12 * MiB, 0, S1);
    assert_true(r == p || r == q); /* both 12 MiB segments are free now */
    tu_free(r);
    tu_free(x);
    tu_free(y);
    CHECK_OK();
}

/* Uses past the first four (the use array grows) keep the first four: a
 * block used on six held streams stays active until the first of them is
 * released too, not only the last two. */
static void test_uses_kept_when_the_use_array_grows(void **state)
{
    (void)state;
    void *p = tu_malloc(4000, 0, S1);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(tally_host_stream_hold(STREAM(20 + i), 1), 0);
        assert_int_equal(tally_record_stream(p, STREAM(20 + i)), 0);
    }
    tu_free(p);
    for (int i = 5; i >= 1; i--)
        assert_int_equal(tally_host_stream_hold(STREAM(20 + i), 0), 0);
    void *q = tu_malloc(4000, 0, S1); /* the first stream still holds p */
    assert_ptr_not_equal(q, p);
    expect_counts(0, 1, 2, 8192, 8000);
    assert_int_equal(tally_host_stream_hold(STREAM(20), 0), 0);
    void *r = tu_malloc(4000, 0, S1);
    assert_ptr_equal(r, p);
    tu_free(q);
    tu_free(r);
    CHECK_OK();
}

/* An event on a stream that is not busy is complete, but the block is
 * still pending until the next malloc looks. */
static void test_event_on_idle_stream_resolves_at_next_malloc(void **state)
{
    (void)state;
    void *p = tu_malloc(4096, 0, S1);
    assert_int_equal(tally_record_stream(p, S4), 0);
    tu_free(p);
    expect_counts(0, 0, 1, 4096, 4096);
    void *q = tu_malloc(4096, 0, S1);
    assert_ptr_equal(q, p);
    expect_counts(0, 1, 1, 4096, 4096);
    tu_free(q);
    expect_counts(0, 0, 0, 0, 0);
}

/* Each device processes its own events: a malloc on device 1 does not
 * resolve a pending block of device 0. */
static void test_events_are_processed_per_device(void **state)
{
    (void)state;
    void *p = tu_malloc(4096, 0, S1);
    tally_record_stream(p, S4);
    tu_free(p);
    void *other = tu_malloc(4096, 1, S1);
    expect_counts(0, 0, 1, 4096, 4096);
    void *q = tu_malloc(4096, 0, S1);
    expect_counts(0, 1, 1, 4096, 4096);
    tu_free(q);
    tu_free(other);
    CHECK_OK();
}

static void test_empty_cache_synchronises_and_releases(void **state)
{
    (void)state;
    void *p = tu_malloc(4096, 0, S1);
    tally_host_stream_hold(S2, 1);
    tally_record_stream(p, S2);
    tu_free(p);
    tally_stats_t a = tu_stats(0);
    EQ(a.active[0].current, 1);
    EQ(a.reserved_bytes[0].current, 2 * MiB);
    size_t released = tally_empty_cache(0); /* waits for the event even though S2 is held */
    tally_stats_t b = tu_stats(0);
    EQ(released, 2 * MiB);
    EQ(b.num_sync_all_streams - a.num_sync_all_streams, 1);
    EQ(b.num_device_free - a.num_device_free, 1);
    EQ(b.active[0].current, 0);
    EQ(b.requested_bytes[0].current, 0);
    EQ(b.reserved_bytes[0].current, 0);
    CHECK_OK();
    tally_host_stream_hold(S2, 0);
}

/* A pending block is not merged with its free neighbours; it merges when
 * its own events complete. */
static void test_pending_neighbour_is_not_merged(void **state)
{
    (void)state;
    void *a = tu_malloc(1024, 0, S1);
    void *b = tu_malloc(1024, 0, S1);
    void *c = tu_malloc(1024, 0, S1);
    tally_host_stream_hold(S2, 1);
    tally_record_stream(b, S2);
    tu_free(b);
    tu_free(a);
    tu_free(c);
    tally_stats_t s = tu_stats(0);
    /* a (free), b (pending), c merged with the tail (free). */
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 2);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 2 * MiB - 1024);
    EQ(s.active[0].current, 1);
    CHECK_OK();
    tally_host_stream_hold(S2, 0);
    void *big = tu_malloc(12 * MiB, 0, S1); /* large pool: leaves the small segment alone */
    s = tu_stats(0);
    EQ(s.inactive_split[TALLY_POOL_SMALL].current, 0);
    EQ(s.inactive_split_bytes[TALLY_POOL_SMALL].current, 0);
    EQ(s.active[TALLY_POOL_SMALL].current, 0);
    CHECK_OK();
    tu_free(big);
    EQ(tally_empty_cache(0), 14 * MiB);
}

/* The OOM path (release_cached_blocks) synchronises events too: a pending
 * block's segment is released and the retry succeeds. */
static void test_oom_retry_path_resolves_pending_blocks(void **state)
{
    (void)state;
    void *p = tu_malloc(4096, 1, S1);
    tally_host_stream_hold(S2, 1);
    tally_record_stream(p, S2);
    tu_free(p);
    tally_stats_t a = tu_stats(1);
    void *big = tu_malloc(80 * GiB, 1, S1); /* the whole device: needs p's segment back */
    assert_non_null(big);
    tally_stats_t b = tu_stats(1);
    EQ(b.num_sync_all_streams - a.num_sync_all_streams, 1);
    EQ(b.num_alloc_retries - a.num_alloc_retries, 1);
    EQ(b.num_ooms - a.num_ooms, 0);
    EQ(b.num_device_free - a.num_device_free, 1);
    EQ(b.active[0].current, 1);
    EQ(b.reserved_bytes[0].current, 80 * GiB);
    tu_free(big);
    tally_host_stream_hold(S2, 0);
    CHECK_OK();
}

/* Holding a stream again after releasing it does not bring back events
 * recorded under the earlier hold; new events wait for the new hold. */
static void test_rehold_only_delays_new_events(void **state)
{
    (void)state;
    void *p = tu_malloc(4096, 0, S1);
    void *keep = tu_malloc(4096, 0, S1);
    tally_host_stream_hold(S2, 1);
    tally_record_stream(p, S2);
    tu_free(p);
    tally_host_stream_hold(S2, 0);
    tally_host_stream_hold(S2, 1);
    void *q = tu_malloc(4096, 0, S1);
    assert_ptr_equal(q, p); /* p's event belonged to the first hold */
    tally_record_stream(q, S2);
    tu_free(q);
    void *r = tu_malloc(4096, 0, S1);
    assert_ptr_not_equal(r, q);
    expect_counts(0, 2, 3, 3 * 4096, 3 * 4096);
    tally_host_stream_hold(S2, 0);
    tu_free(r);
    tu_free(tu_malloc(512, 1, S1)); /* other device: no effect on device 0 */
    expect_counts(0, 1, 2, 2 * 4096, 2 * 4096);
    tu_free(keep);
    void *s = tu_malloc(4096, 0, S1);
    expect_counts(0, 1, 1, 4096, 4096);
    tu_free(s);
    CHECK_OK();
}

/* free_checked goes through the same deferred path. */
static void test_free_checked_respects_stream_uses(void **state)
{
    (void)state;
    void *p = tu_malloc(3000, 0, S1);
    tally_host_stream_hold(S3, 1);
    tally_record_stream(p, S3);
    assert_int_equal(tu_free_checked(p, 3000, 0), 0);
    expect_counts(0, 0, 1, 3072, 3000);
    tally_host_stream_hold(S3, 0);
    tu_free(tu_malloc(512, 0, S1));
    expect_counts(0, 0, 0, 0, 0);
}

/* Many blocks on many held streams, released in an order unrelated to the
 * order of the frees. */
static void test_many_pending_blocks_complete_independently(void **state)
{
    (void)state;
    enum { N = 64 };
    void *p[N];
    for (int i = 0; i < 4; i++)
        tally_host_stream_hold(STREAM(2 + i), 1);
    for (int i = 0; i < N; i++) {
        p[i] = tu_malloc(512 * (size_t)(1 + i % 7), 0, S1);
        tally_record_stream(p[i], STREAM(2 + i % 4));
        if (i % 3 == 0)
            tally_record_stream(p[i], STREAM(2 + (i + 1) % 4));
    }
    for (int i = 0; i < N; i++)
        tu_free(p[i]);
    EQ(tu_stats(0).active[0].current, N);
    CHECK_OK();
    /* Release stream 3 only: blocks used on 3 alone complete. */
    int64_t expect = 0;
    tally_host_stream_hold(STREAM(3), 0);
    for (int i = 0; i < N; i++) {
        bool only3 = (2 + i % 4) == 3 && i % 3 != 0;
        bool pair3 = i % 3 == 0 && (2 + i % 4) == 3 && (2 + (i + 1) % 4) == 3;
        if (!(only3 || pair3))
            expect++;
    }
    void *t = tu_malloc(512, 1, S1);
    tu_free(t);
    tu_free(tu_malloc(512, 0, S4));
    EQ(tu_stats(0).active[0].current, expect);
    CHECK_OK();
    for (int i = 0; i < 4; i++)
        tally_host_stream_hold(STREAM(2 + i), 0);
    tu_free(tu_malloc(512, 0, S4));
    EQ(tu_stats(0).active[0].current, 0);
    CHECK_OK();
}

/* A released stream is no longer held: holding and releasing many
 * different streams over time must keep working (the host backend has a
 * fixed table of hold slots). Runs last: it may use up that table. */
static void test_hold_and_release_many_distinct_streams(void **state)
{
    (void)state;
    for (int i = 0; i < 200; i++) {
        void *s = STREAM(1000 + i);
        void *p = tu_malloc(4096, 0, S1);
        cap_begin();
        int rc = tally_host_stream_hold(s, 1);
        cap_end();
        if (rc != 0)
            fail_msg("stream %d: tally_host_stream_hold failed with none held: %s", i, tally_last_error());
        tally_record_stream(p, s);
        tu_free(p);
        EQ(tu_stats(0).active[0].current, 1);
        assert_int_equal(tally_host_stream_hold(s, 0), 0);
        tu_free(tu_malloc(512, 0, S1));
        EQ(tu_stats(0).active[0].current, 0);
    }
    CHECK_OK();
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,host_capacity:80GiB,host_mode:virtual");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_pending_block_stays_active_until_events_processed, setup_clean),
        cmocka_unit_test_setup(test_block_waits_for_every_recorded_stream, setup_clean),
        cmocka_unit_test_setup(test_uses_kept_when_the_use_array_grows, setup_clean),
        cmocka_unit_test_setup(test_event_on_idle_stream_resolves_at_next_malloc, setup_clean),
        cmocka_unit_test_setup(test_events_are_processed_per_device, setup_clean),
        cmocka_unit_test_setup(test_empty_cache_synchronises_and_releases, setup_clean),
        cmocka_unit_test_setup(test_pending_neighbour_is_not_merged, setup_clean),
        cmocka_unit_test_setup(test_oom_retry_path_resolves_pending_blocks, setup_clean),
        cmocka_unit_test_setup(test_rehold_only_delays_new_events, setup_clean),
        cmocka_unit_test_setup(test_free_checked_respects_stream_uses, setup_clean),
        cmocka_unit_test_setup(test_many_pending_blocks_complete_independently, setup_clean),
        cmocka_unit_test_setup(test_hold_and_release_many_distinct_streams, setup_clean),
    };
    return cmocka_run_group_tests_name("events", tests, NULL, NULL);
}
