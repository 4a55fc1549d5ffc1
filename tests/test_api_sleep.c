/* Private tags, sleep and wake on the host backend (docs/sleep.md): a
 * private tag's blocks live on pages of their own; sleep unmaps them and
 * keeps the addresses (the pages become inaccessible), wake maps them back
 * at the same addresses, and after an offload restores every byte; every
 * refusal is one line and changes nothing.
 *
 * Two simulated 1 GiB devices in backed mode (contents are real), with kv
 * and weights private through the configuration. */
#include "ledgerutil.h"
#include "sleeputil.h"

#include <limits.h>
#include <signal.h>

#define MB LU_MiB
#define CONF "backend:host,host_devices:2,host_mode:backed,host_capacity:1GiB,private_tags:kv|weights"

static const char *KV[] = {"kv"}, *W[] = {"weights"}, *BOTH[] = {"weights", "kv"};

static int setup(void **state)
{
    tally_set_sink(lu_null_sink, NULL);
    const char *all[] = {"kv", "weights", "late"};
    for (int i = 0; i < 3; i++)
        if (tally_tag_is_private(all[i]) == 1)
            tally_wake(&all[i], 1);
    tally_configure("sleep_alloc:refuse");
    return lu_setup_clean(state);
}
#define T(f) cmocka_unit_test_setup(f, setup)

static int64_t reserved(int device)
{
    return lu_stats(device).reserved_bytes[0].current;
}

static void *tagged(const char *tag, size_t size, int device)
{
    LU_OK(tally_tag_push(tag));
    void *p = tally_malloc(size, device, NULL);
    tally_tag_pop();
    if (!p)
        fail_msg("tally_malloc(%zu) under %s: %s", size, tag, tally_last_error());
    return p;
}

static tally_sleep_info_t info(const char *tag, int device)
{
    tally_sleep_info_t i;
    LU_OK(tally_tag_sleep_info(tag, device, &i));
    return i;
}

/* ---- private placement ------------------------------------------------------------------ */

static void test_private_tags_get_pages_of_their_own(void **state)
{
    (void)state;
    LU_EQ(tally_tag_is_private("kv"), 1);
    LU_EQ(tally_tag_is_private("weights"), 1);
    LU_EQ(tally_tag_is_private("other"), 0);
    /* Small blocks: untagged and kv alternate; no kv block may share a
     * segment with an untagged one. */
    void *u[8], *k[8];
    for (int i = 0; i < 8; i++) {
        u[i] = lu_malloc(4096, 0);
        k[i] = tagged("kv", 4096, 0);
    }
    for (int i = 0; i < 8; i++) {
        size_t us = 0, ks = 0;
        char *ub = tally_torch_base_alloc(u[i], &us), *kb = tally_torch_base_alloc(k[i], &ks);
        for (int j = 0; j < 8; j++) {
            char *x = u[j];
            if (x >= kb && x < kb + ks)
                fail_msg("untagged block %p lies in kv's segment %p", u[j], (void *)kb);
        }
        assert_true((char *)k[i] < ub || (char *)k[i] >= ub + us);
    }
    /* Freed kv memory is not handed to another tag, nor another's to kv. */
    void *kbig = tagged("kv", 30 * MB, 0);
    tally_free(kbig);
    void *other = lu_malloc(30 * MB, 0);
    assert_ptr_not_equal(other, kbig);
    void *again = tagged("kv", 30 * MB, 0);
    assert_ptr_equal(again, kbig);
    tally_free(other);
    void *wbig = tagged("weights", 30 * MB, 0);
    assert_ptr_not_equal(wbig, other);
    tally_free(wbig);
    tally_free(again);
    lu_free_all(u, 8);
    lu_free_all(k, 8);
    LU_CHECK_OK();
}

static void test_set_private_at_run_time(void **state)
{
    (void)state;
    LU_EQ(tally_tag_is_private("late"), 0);
    LU_OK(tally_tag_set_private("late"));
    LU_EQ(tally_tag_is_private("late"), 1);
    LU_OK(tally_tag_set_private("late")); /* twice is fine */
    void *p = tagged("late", 1 * MB, 1);
    void *q = lu_malloc(1 * MB, 1);
    size_t ps = 0;
    char *pb = tally_torch_base_alloc(p, &ps);
    assert_true((char *)q < pb || (char *)q >= pb + ps);
    LU_EQ(tally_tag_set_private("untagged"), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "cannot be private");
    tally_free(p);
    tally_free(q);
    LU_CHECK_OK();
}

/* ---- sleep and wake --------------------------------------------------------------------- */

static void test_discard_unmaps_and_wake_maps_back(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *a = tagged("kv", 40 * MB, 0), *b = tagged("kv", 4096, 0);
    memset(a, 0x5a, 40 * MB);
    int64_t held = reserved(0) - before;
    assert_true(held >= 42 * (int64_t)MB);
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    LU_EQ(reserved(0), before);
    tally_sleep_info_t i = info("kv", 0);
    LU_EQ(i.asleep, 1);
    LU_EQ(i.offloaded, 0);
    LU_EQ(i.sleeping_blocks, 2);
    LU_EQ(i.sleeping, 40 * MB + 4096);
    LU_EQ(i.unmapped, held);
    LU_EQ(i.offload, 0);
    LU_EQ(i.reserved, 0);
    assert_true(su_faults(a));
    assert_true(su_faults(b));
    LU_CHECK_OK();
    LU_OK(tally_wake(KV, 1));
    LU_EQ(reserved(0), before + held);
    assert_false(su_faults(a));
    /* Discarded: the pages came back empty. */
    assert_int_equal(((unsigned char *)a)[0], 0);
    assert_int_equal(((unsigned char *)a)[40 * MB - 1], 0);
    i = info("kv", 0);
    LU_EQ(i.asleep, 0);
    LU_EQ(i.sleeps, i.wakes);
    LU_EQ(i.reserved, held);
    /* The blocks are the same blocks, still live and usable. */
    LU_EQ(lu_info(a).size, 40 * MB);
    memset(a, 1, 40 * MB);
    tally_free(a);
    tally_free(b);
    LU_CHECK_OK();
}

static void test_offload_restores_every_byte(void **state)
{
    (void)state;
    void *w[3] = {tagged("weights", 24 * MB + 512, 0), tagged("weights", 3000, 0), tagged("weights", 64 * MB, 1)};
    size_t sz[3] = {24 * MB + 512, 3000, 64 * MB};
    for (int i = 0; i < 3; i++)
        su_fill(w[i], sz[i], (unsigned)i * 7 + 1);
    int64_t r0 = reserved(0), r1 = reserved(1);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    assert_true(reserved(0) < r0 && reserved(1) < r1);
    tally_sleep_info_t all = info("weights", -1);
    LU_EQ(all.asleep, 1);
    LU_EQ(all.offloaded, 1);
    LU_EQ(all.sleeping_blocks, 3);
    /* Offload holds the rounded live blocks, not the free rest. */
    LU_EQ(all.offload, (24 * MB + 512) + 3072 + 64 * MB);
    for (int i = 0; i < 3; i++)
        assert_true(su_faults(w[i]));
    LU_OK(tally_wake(W, 1));
    LU_EQ(reserved(0), r0);
    LU_EQ(reserved(1), r1);
    for (int i = 0; i < 3; i++)
        if (!su_same(w[i], sz[i], (unsigned)i * 7 + 1))
            fail_msg("block %d differs after wake", i);
    LU_EQ(info("weights", -1).offload, 0);
    lu_free_all(w, 3);
    LU_CHECK_OK();
}

static void test_several_tags_in_one_call(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *w = tagged("weights", 10 * MB, 0), *k = tagged("kv", 10 * MB, 0);
    su_fill(w, 10 * MB, 3);
    LU_OK(tally_sleep(BOTH, 2, TALLY_SLEEP_OFFLOAD | TALLY_SLEEP_SYNC_DEVICE));
    LU_EQ(reserved(0), before);
    LU_EQ(info("kv", 0).asleep, 1);
    LU_EQ(info("weights", 0).asleep, 1);
    LU_OK(tally_wake(BOTH, 2));
    assert_true(su_same(w, 10 * MB, 3));
    tally_free(w);
    tally_free(k);
    LU_CHECK_OK();
}

/* TALLY_SLEEP_SYNC_DEVICE waits for each whole device once per tag, and the
 * statistics say so: num_sync_all_streams grows by one on every device the
 * tag sleeps on (it sleeps on all, holding memory there or not), and by
 * nothing without the flag; a sleep maps nothing, so num_device_alloc stays. */
static void test_sleep_sync_device_counts_one_device_sync_per_device(void **state)
{
    (void)state;
    void *k = tagged("kv", 10 * MB, 0);
    tally_stats_t a0 = lu_stats(0), a1 = lu_stats(1);
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_SYNC_DEVICE));
    tally_stats_t b0 = lu_stats(0), b1 = lu_stats(1);
    LU_EQ(b0.num_sync_all_streams - a0.num_sync_all_streams, 1);
    LU_EQ(b1.num_sync_all_streams - a1.num_sync_all_streams, 1);
    LU_EQ(b0.num_device_alloc - a0.num_device_alloc, 0);
    LU_EQ(b1.num_device_alloc - a1.num_device_alloc, 0);
    LU_OK(tally_wake(KV, 1));
    a0 = lu_stats(0);
    a1 = lu_stats(1);
    LU_OK(tally_sleep(KV, 1, 0));
    b0 = lu_stats(0);
    b1 = lu_stats(1);
    LU_EQ(b0.num_sync_all_streams - a0.num_sync_all_streams, 0);
    LU_EQ(b1.num_sync_all_streams - a1.num_sync_all_streams, 0);
    LU_EQ(b0.num_device_alloc - a0.num_device_alloc, 0);
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

static void test_sleep_releases_free_segments(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *a = tagged("kv", 30 * MB, 0), *b = tagged("kv", 30 * MB, 0);
    tally_free(b); /* a whole free segment, cached */
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    LU_EQ(reserved(0), before);
    LU_OK(tally_wake(KV, 1));
    LU_EQ(reserved(0), before + 30 * (int64_t)MB); /* only a's segment came back */
    tally_free(a);
    LU_CHECK_OK();
}

/* A segment whose blocks are all freed while asleep needs no pages: empty_cache
 * gives its addresses back and counts no bytes (none were reserved), and a
 * wake does not map it. */
static void test_segments_freed_while_asleep(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *a = tagged("kv", 30 * MB, 0), *b = tagged("kv", 30 * MB, 0), *c = tagged("kv", 30 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_EQ(reserved(0), before);
    tally_free(a);
    LU_EQ(tally_empty_cache(0), 0);
    LU_EQ(reserved(0), before);
    tally_free(b);
    LU_CHECK_OK();
    LU_OK(tally_wake(KV, 1));
    LU_EQ(reserved(0), before + 30 * (int64_t)MB); /* c's segment only */
    tally_free(c);
    LU_CHECK_OK();
}

/* ---- errors ----------------------------------------------------------------------------- */

static void test_second_sleep_and_wake_do_nothing(void **state)
{
    (void)state;
    void *a = tagged("kv", 2 * MB, 0);
    tally_sleep_info_t was = info("kv", 0);
    LU_OK(tally_sleep(KV, 1, 0));
    lu_cap_begin();
    LU_OK(tally_sleep(KV, 1, 0));
    LU_HAS(lu_cap_text(), "tally_sleep: tag 'kv' is already asleep: nothing done");
    LU_EQ(lu_cap_lines(), 1);
    LU_OK(tally_wake(KV, 1));
    lu_cap_begin();
    LU_OK(tally_wake(KV, 1));
    LU_HAS(lu_cap_text(), "tally_wake: tag 'kv' is awake: nothing done");
    LU_EQ(lu_cap_lines(), 1);
    lu_cap_end();
    LU_EQ(info("kv", 0).sleeps, was.sleeps + 1);
    LU_EQ(info("kv", 0).wakes, was.wakes + 1);
    tally_free(a);
}

static void test_not_private_is_refused(void **state)
{
    (void)state;
    void *a = tagged("shared-tag", 2 * MB, 0);
    int64_t r = reserved(0);
    const char *t[] = {"shared-tag"};
    lu_cap_begin();
    LU_EQ(tally_sleep(t, 1, 0), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "tally_sleep: tag 'shared-tag' is not private: its blocks may share pages");
    LU_EQ(lu_cap_lines(), 1);
    /* Checked before anything sleeps: kv stays awake. */
    const char *mixed[] = {"kv", "shared-tag"};
    void *k = tagged("kv", 2 * MB, 0);
    LU_EQ(tally_sleep(mixed, 2, 0), -TALLY_EINVAL);
    LU_EQ(info("kv", 0).asleep, 0);
    LU_EQ(tally_wake(t, 1), -TALLY_EINVAL);
    LU_EQ(tally_sleep(NULL, 1, 0), -TALLY_EINVAL);
    LU_EQ(tally_sleep(KV, 0, 0), -TALLY_EINVAL);
    LU_EQ(tally_sleep(KV, 1, 8), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "unknown flags");
    lu_cap_end();
    assert_true(reserved(0) >= r);
    tally_free(a);
    tally_free(k);
    LU_CHECK_OK();
}

static void test_blocks_from_before_private_are_refused(void **state)
{
    (void)state;
    void *early = tagged("became-private", 2 * MB, 0);
    LU_OK(tally_tag_set_private("became-private"));
    void *later = tagged("became-private", 2 * MB, 0);
    const char *t[] = {"became-private"};
    LU_EQ(tally_sleep(t, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "was allocated before the tag became private");
    LU_EQ(info("became-private", 0).asleep, 0);
    tally_free(early);
    LU_OK(tally_sleep(t, 1, 0));
    LU_OK(tally_wake(t, 1));
    tally_free(later);
    LU_CHECK_OK();
}

static int accept_all(void *arg, void *stream)
{
    (void)arg, (void)stream;
    return 1;
}

static void test_graph_pool_blocks_are_refused(void **state)
{
    (void)state;
    LU_OK(tally_graph_pool_begin(0, 7, 9, accept_all, NULL));
    void *g = tagged("kv", 2 * MB, 0); /* the graph's pool wins */
    LU_OK(tally_graph_pool_end(0, 7, 9));
    LU_EQ(tally_sleep(KV, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "belongs to a CUDA graph's pool (7, 9)");
    tally_free(g);
    LU_OK(tally_graph_pool_release(0, 7, 9));
    LU_CHECK_OK();
}

/* Between tally_graph_pool_begin and _end a capture is taken to be under
 * way (announced): no private tag sleeps then, on any device. */
static void test_capture_under_way_is_refused(void **state)
{
    (void)state;
    void *k = tagged("kv", 2 * MB, 1);
    LU_OK(tally_graph_pool_begin(0, 3, 4, accept_all, NULL));
    LU_EQ(tally_sleep(KV, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "tally_sleep: tag 'kv' cannot sleep: a CUDA graph capture is under way on device 0");
    LU_EQ(info("kv", 1).asleep, 0);
    LU_OK(tally_graph_pool_end(0, 3, 4));
    LU_OK(tally_graph_pool_release(0, 3, 4));
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

static void test_ipc_exported_blocks_are_refused(void **state)
{
    (void)state;
    void *k = tagged("kv", 2 * MB, 1);
    size_t sz;
    assert_non_null(tally_torch_base_alloc(k, &sz));
    LU_EQ(tally_sleep(KV, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "exported for IPC (base_alloc)");
    LU_EQ(info("kv", 1).asleep, 0);
    tally_free(k);
    tally_empty_cache(-1); /* the exported segment goes */
    void *again = tagged("kv", 2 * MB, 1);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(again);
}

static void test_allocation_under_a_sleeping_tag(void **state)
{
    (void)state;
    void *a = tagged("kv", 2 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_tag_push("kv"));
    assert_null(tally_malloc(4096, 0, NULL));
    LU_HAS(tally_last_error(), "tally_malloc: tag 'kv' is asleep on device 0: wake it first");
    LU_EQ(info("kv", 0).asleep, 1);
    LU_OK(tally_configure("sleep_alloc:wake"));
    lu_cap_begin();
    void *b = tally_malloc(4096, 0, NULL);
    lu_cap_end();
    tally_tag_pop();
    assert_non_null(b);
    LU_HAS(lu_cap_text(), "waking it for an allocation (sleep_alloc:wake)");
    LU_EQ(info("kv", 0).asleep, 0);
    tally_free(a);
    tally_free(b);
    LU_CHECK_OK();
}

static void test_free_of_a_sleeping_block_drops_its_backup(void **state)
{
    (void)state;
    void *a = tagged("weights", 8 * MB, 0), *b = tagged("weights", 12 * MB, 0);
    su_fill(b, 12 * MB, 9);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    LU_EQ(info("weights", 0).offload, 20 * MB);
    tally_free(a);
    LU_EQ(info("weights", 0).offload, 12 * MB);
    LU_EQ(info("weights", 0).sleeping_blocks, 1);
    LU_CHECK_OK();
    LU_OK(tally_wake(W, 1));
    assert_true(su_same(b, 12 * MB, 9));
    tally_free(b);
    LU_CHECK_OK();
}

static void test_wake_out_of_memory_rolls_back(void **state)
{
    (void)state;
    void *w = tagged("weights", 300 * MB, 1);
    su_fill(w, 300 * MB, 5);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    int64_t r = reserved(1);
    /* Another tag takes the room while weights sleep. */
    void *big = lu_malloc(800 * MB, 1);
    lu_cap_begin();
    LU_EQ(tally_wake(W, 1), -TALLY_ENOMEM);
    lu_cap_end();
    LU_HAS(tally_last_error(), "tally_wake: tag 'weights' on device 1: out of memory");
    LU_HAS(tally_last_error(), "missing");
    LU_HAS(tally_last_error(), "it stays asleep with its backup");
    assert_null(strchr(tally_last_error(), '\n'));
    LU_EQ(reserved(1), r + 800 * (int64_t)MB);
    tally_sleep_info_t i = info("weights", 1);
    LU_EQ(i.asleep, 1);
    LU_EQ(i.offload, 300 * MB);
    assert_true(su_faults(w));
    LU_CHECK_OK();
    tally_free(big);
    tally_empty_cache(1);
    LU_OK(tally_wake(W, 1));
    assert_true(su_same(w, 300 * MB, 5));
    tally_free(w);
    LU_CHECK_OK();
}

static void test_memory_fraction_bounds_a_wake(void **state)
{
    (void)state;
    void *k = tagged("kv", 100 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_set_memory_fraction(0.05, 0)); /* about 51 MiB */
    LU_EQ(tally_wake(KV, 1), -TALLY_ENOMEM);
    LU_HAS(tally_last_error(), "memory fraction limit");
    LU_EQ(info("kv", 0).asleep, 1);
    LU_OK(tally_set_memory_fraction(1.0, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

/* The fraction is a bound, not a strict one: a wake that brings reserved
 * memory to exactly the limit succeeds (as an allocation that does). A
 * 100 MiB kv segment on the 1 GiB device, asleep; a limit of reserved +
 * 100 MiB (an exact fraction: 1 GiB is a power of two) lets it wake, and
 * one 2 MiB less does not. */
static void test_wake_up_to_exactly_the_fraction(void **state)
{
    (void)state;
    void *k = tagged("kv", 100 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    int64_t r = reserved(0);
    LU_OK(tally_set_memory_fraction((double)(r + 98 * (int64_t)MB) / (double)(1024 * MB), 0));
    lu_cap_begin();
    LU_EQ(tally_wake(KV, 1), -TALLY_ENOMEM);
    lu_cap_end();
    LU_HAS(tally_last_error(), "out of memory, 2.0 MiB missing (memory fraction limit of 102760448 bytes reached)");
    LU_EQ(info("kv", 0).asleep, 1);
    LU_OK(tally_set_memory_fraction((double)(r + 100 * (int64_t)MB) / (double)(1024 * MB), 0));
    LU_OK(tally_wake(KV, 1));
    LU_EQ(info("kv", 0).asleep, 0);
    LU_EQ(reserved(0), r + 100 * (int64_t)MB);
    LU_OK(tally_set_memory_fraction(1.0, 0));
    tally_free(k);
    LU_CHECK_OK();
}

/* What a wake stopped by the fraction is missing: all it needs when the
 * limit leaves no room (a fraction of 0 here), to the byte: 1 GiB, not a
 * byte less ("1024.0 MiB"). */
static void test_wake_with_no_room_under_the_fraction_misses_all_it_needs(void **state)
{
    (void)state;
    void *k = tagged("kv", 1024 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_EQ(reserved(0), 0);
    LU_OK(tally_set_memory_fraction(0.0, 0));
    lu_cap_begin();
    LU_EQ(tally_wake(KV, 1), -TALLY_ENOMEM);
    lu_cap_end();
    LU_HAS(tally_last_error(), "out of memory, 1.0 GiB missing (memory fraction limit of 0 bytes reached)");
    LU_OK(tally_set_memory_fraction(1.0, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

/* ---- accounting ------------------------------------------------------------------------- */

static const tally_json_t *private_row(const tally_json_t *root, const char *tag, int device)
{
    const tally_json_t *rows = lu_jarr(root, "private_tags");
    for (size_t i = 0; i < rows->len; i++)
        if (strcmp(lu_jstr(&rows->items[i], "tag"), tag) == 0 && lu_jint(&rows->items[i], "device") == device)
            return &rows->items[i];
    fail_msg("no private_tags row for %s on device %d", tag, device);
    return NULL;
}

static void test_reports_show_sleeping_bytes(void **state)
{
    (void)state;
    LU_OK(tally_configure("timeline:true"));
    LU_OK(tally_stage_begin("rollout"));
    void *w = tagged("weights", 10 * MB, 0), *k = tagged("kv", 6 * MB, 0);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    /* The ledger: the private tags' table. */
    lu_buf_t b = {0};
    LU_OK(tally_write_ledger(lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "private tags (sleep and wake)");
    LU_HAS(lu_buf_str(&b), "asleep, offloaded");
    LU_HAS(lu_buf_str(&b), "asleep, discarded");
    LU_HAS(lu_buf_str(&b), "10.0 MiB");
    lu_buf_free(&b);
    /* memory_summary: PyTorch's table, then the device's private tags. */
    memset(&b, 0, sizeof b);
    LU_OK(tally_write_summary(0, 0, lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "PyTorch CUDA memory summary");
    assert_true(lu_pos(lu_buf_str(&b), "private tags") > lu_pos(lu_buf_str(&b), "PyTorch CUDA memory summary"));
    LU_LACKS(lu_buf_str(&b), "\n1      kv"); /* only device 0's rows */
    lu_buf_free(&b);
    /* The JSON report: sleeping (owned, not resident) and offload bytes. */
    char path[300];
    snprintf(path, sizeof path, "%s/sleep-report.json", lu_tmpdir());
    LU_OK(tally_write_report(path));
    tally_json_t *root = lu_json_file(path);
    const tally_json_t *rw = private_row(root, "weights", 0), *rk = private_row(root, "kv", 0);
    LU_EQ(lu_jbool(rw, "asleep"), 1);
    LU_EQ(lu_jbool(rw, "offloaded"), 1);
    LU_EQ(lu_jint(rw, "sleeping_bytes"), 10 * MB);
    LU_EQ(lu_jint(rw, "offload_bytes"), 10 * MB);
    LU_EQ(lu_jint(rw, "mapped_bytes"), 0);
    LU_EQ(lu_jint(rk, "sleeping_bytes"), 6 * MB);
    LU_EQ(lu_jint(rk, "offload_bytes"), 0);
    /* Still owned: the ledger keeps counting them. */
    LU_EQ(lu_jint(lu_ledger_row(root, "weights", "rollout", 0), "current_bytes"), 10 * MB);
    const tally_json_t *tl = lu_jarr(root, "timeline");
    int sleeps = 0;
    for (size_t i = 0; i < tl->len; i++)
        sleeps += strcmp(lu_jstr(&tl->items[i], "action"), "sleep") == 0 && lu_jint(&tl->items[i], "device") == 0 &&
                  lu_jint(&tl->items[i], "size") > 0;
    LU_EQ(sleeps, 2); /* each tag on device 0, with the bytes it unmapped */
    tally__json_free(root);
    /* tally plot marks each sleep on the timeline (the command next to this
     * test's directory: build/bin/tally). */
    char exe[PATH_MAX], cmd[3 * PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(cmd, sizeof cmd, "'%s/../bin/tally' plot --device 0 '%s' -o '%s.svg' > /dev/null", exe, path, path);
    LU_EQ(system(cmd), 0);
    char svg[320];
    snprintf(svg, sizeof svg, "%s.svg", path);
    char *text = lu_read_file(svg, NULL);
    LU_HAS(text, "<path class=\"sleep\"");
    LU_HAS(text, "<title>tag weights slept: 10485760 bytes unmapped</title>");
    /* kv's 6 MiB block sits in a 20 MiB segment: all of it goes */
    LU_HAS(text, "<title>tag kv slept: 20971520 bytes unmapped</title>");
    free(text);
    /* The leak report counts the sleeping blocks still owned. */
    memset(&b, 0, sizeof b);
    LU_OK(tally_write_leaks(0, lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "tally: SUMMARY: 2 of those blocks (16777216 bytes) are asleep");
    lu_buf_free(&b);
    /* The stage report says which tags slept and woke. */
    LU_OK(tally_wake(W, 1));
    lu_cap_begin();
    LU_OK(tally_stage_end("rollout"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "tally: stage rollout: private tags weights slept (offloaded to host), kv slept "
                          "(discarded), weights woke");
    LU_OK(tally_wake(KV, 1));
    tally_free(w);
    tally_free(k);
    LU_OK(tally_configure("timeline:false"));
    LU_CHECK_OK();
}

/* A stage's report names the sleeps and wakes since that stage began: an
 * inner stage its own only, the outer one all of them; a refused end (a
 * stage that is not the innermost) takes nothing from either. Each stage
 * keeps its mark in its own frame. */
static void test_each_stage_report_names_the_sleeps_since_its_own_begin(void **state)
{
    (void)state;
    void *w = tagged("weights", 4 * MB, 0), *k = tagged("kv", 4 * MB, 0);
    LU_OK(tally_stage_begin("outer"));
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_DISCARD));
    LU_OK(tally_stage_begin("inner"));
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    lu_cap_begin();
    LU_EQ(tally_stage_end("outer"), -TALLY_ESTATE);
    lu_cap_end();
    LU_HAS(lu_cap_text(), "'outer' is not the innermost stage (that is 'inner')");
    LU_OK(tally_wake(W, 1));
    lu_cap_begin();
    LU_OK(tally_stage_end("inner"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "tally: stage inner: private tags kv slept (discarded), weights woke\n");
    LU_OK(tally_wake(KV, 1));
    lu_cap_begin();
    LU_OK(tally_stage_end("outer"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "tally: stage outer: private tags weights slept (discarded), kv slept (discarded), "
                          "weights woke, kv woke\n");
    /* A stage with no sleep or wake in it names none. */
    LU_OK(tally_stage_begin("quiet"));
    lu_cap_begin();
    LU_OK(tally_stage_end("quiet"));
    lu_cap_end();
    assert_null(strstr(lu_cap_text(), "private tags"));
    tally_free(w);
    tally_free(k);
    LU_CHECK_OK();
}

/* ---- children: other configurations ------------------------------------------------------ */

static int child_virtual_offload(void)
{
    tally_set_sink(lu_null_sink, NULL);
    LU_REQUIRE(tally_init() == 0);
    LU_OK(tally_tag_push("kv"));
    void *p = tally_malloc(4 * MB, 0, NULL);
    tally_tag_pop();
    LU_REQUIRE(p != NULL);
    int rc = tally_sleep(KV, 1, TALLY_SLEEP_OFFLOAD);
    printf("rc=%d %s\n", rc, tally_last_error());
    tally_sleep_info_t i;
    tally_tag_sleep_info("kv", 0, &i);
    printf("asleep=%d\n", i.asleep);
    rc = tally_sleep(KV, 1, TALLY_SLEEP_DISCARD);
    printf("discard=%d\n", rc);
    return 0;
}

static void test_virtual_mode_refuses_offload(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "virtual", "backend:host,host_mode:virtual,private_tags:kv", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "rc=-4 tally_sleep: tag 'kv' on device 0: host_mode:virtual holds no contents");
    LU_HAS(c.out, "(nothing of it was unmapped)");
    LU_HAS(c.out, "asleep=0");
    LU_HAS(c.out, "discard=0");
    lu_child_free(&c);
}

static int child_async(void)
{
    int rc = tally_init();
    printf("init=%d %s\n", rc, tally_last_error());
    return 0;
}

static int child_async_runtime(void)
{
    tally_set_sink(lu_null_sink, NULL);
    int rc = tally_tag_set_private("kv2");
    printf("set=%d %s\n", rc, tally_last_error());
    return 0;
}

static void test_async_backend_refuses_private_tags(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "async", "backend:async,private_tags:kv", NULL);
    LU_CHILD_EXIT(&c, 0);
    if (strstr(c.out, "unusable")) {
        lu_child_free(&c);
        skip(); /* no CUDA stand-in or driver here */
    }
    LU_HAS(c.out, "init=-3 private_tags: backend async passes allocations through to CUDA's stream-ordered pools");
    lu_child_free(&c);
    lu_child_run(&c, "async-runtime", "backend:async", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "set=-5 tally_tag_set_private: 'kv2': backend async passes allocations through");
    lu_child_free(&c);
}

/* private_tags names are 1 to 200 bytes, as every tag name: an empty name or
 * a longer one is refused at initialisation with one line that gives the
 * reason first (the list may be long), and nothing is made private ("kv|",
 * a list ended by its separator, is kv alone). A child
 * per list (the key is read once, at start). */
static int child_init_only(void)
{
    tally_set_sink(lu_null_sink, NULL);
    int rc = tally_init();
    printf("init=%d %s\n", rc, rc ? tally_last_error() : "");
    return 0;
}

static void test_private_tag_names_empty_or_overlong_refused(void **state)
{
    (void)state;
    char name[400], conf[500];
    memset(name, 'n', sizeof name);
    static const size_t lens[] = {200, 201, 255, 256, 300};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        name[lens[i]] = 0;
        snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,private_tags:kv|%s|w", name);
        lu_child_t c;
        lu_child_run(&c, "init-only", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        if (lens[i] == 200)
            LU_HAS(c.out, "init=0 \n");
        else
            LU_HAS(c.out, "init=-3 private_tags: tag name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...' is longer "
                          "than 200 characters\n");
        lu_child_free(&c);
        name[lens[i]] = 'n';
    }
    static const char *const empty[] = {"kv||w", "|kv"}; /* a trailing | ends the list */
    for (size_t i = 0; i < 2; i++) {
        char want[100];
        snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,private_tags:%s", empty[i]);
        lu_child_t c;
        lu_child_run(&c, "init-only", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        snprintf(want, sizeof want, "init=-3 private_tags: an empty tag name in '%s'\n", empty[i]);
        LU_HAS(c.out, want);
        lu_child_free(&c);
    }
}

int main(int argc, char **argv)
{
    static const lu_role_t roles[] = {{"virtual", child_virtual_offload},
                                      {"init-only", child_init_only},
                                      {"async", child_async},
                                      {"async-runtime", child_async_runtime},
                                      {NULL, NULL}};
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    const struct CMUnitTest tests[] = {
        T(test_private_tags_get_pages_of_their_own),
        T(test_set_private_at_run_time),
        T(test_discard_unmaps_and_wake_maps_back),
        T(test_offload_restores_every_byte),
        T(test_several_tags_in_one_call),
        T(test_sleep_sync_device_counts_one_device_sync_per_device),
        T(test_sleep_releases_free_segments),
        T(test_segments_freed_while_asleep),
        T(test_second_sleep_and_wake_do_nothing),
        T(test_not_private_is_refused),
        T(test_blocks_from_before_private_are_refused),
        T(test_graph_pool_blocks_are_refused),
        T(test_capture_under_way_is_refused),
        T(test_ipc_exported_blocks_are_refused),
        T(test_allocation_under_a_sleeping_tag),
        T(test_free_of_a_sleeping_block_drops_its_backup),
        T(test_wake_out_of_memory_rolls_back),
        T(test_memory_fraction_bounds_a_wake),
        T(test_wake_up_to_exactly_the_fraction),
        T(test_wake_with_no_room_under_the_fraction_misses_all_it_needs),
        T(test_reports_show_sleeping_bytes),
        T(test_each_stage_report_names_the_sleeps_since_its_own_begin),
        T(test_virtual_mode_refuses_offload),
        T(test_async_backend_refuses_private_tags),
        T(test_private_tag_names_empty_or_overlong_refused),
    };
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    setenv("TALLY_CONF", CONF, 1);
    int failed = cmocka_run_group_tests_name("sleep", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
