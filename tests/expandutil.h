/* Shared by the expandable-segment tests on the host backend
 * (test_cache_expand_pages, test_cache_expand_handles): their
 * configuration, the page size, a stream, statistics, the host backend's
 * call counts, the setup that puts
 * the runtime keys back before each test, the random workloads' draws,
 * and a sink that drops what it is
 * given (the OOM reports of a full device). */
#ifndef TALLY_TESTS_EXPANDUTIL_H
#define TALLY_TESTS_EXPANDUTIL_H

#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Chunk of one page, so that most tests see a block's own pages only;
 * the chunk tests set it at run time. Pages move without limit
 * (expandable_move_budget:-1, set by reset()): these tests are of the
 * moving policy; test_cache_expand_steady.c tests the default, which moves
 * none. Device 1 has 256 MiB (host_capacity). */
#define EXPAND_TEST_CONF                                                                                           \
    "backend:host,host_devices:2,host_mode:virtual,host_capacity:256MiB,expandable_segments:true,"                 \
    "expandable_grow_chunk_mb:2,leak_report:off"

#define PAGE (2 * MiB)

static void *stream_a = (void *)0x100;

static inline tally_stats_t stats(int dev)
{
    tally_stats_t s;
    assert_int_equal(tally_get_stats(dev, &s), 0);
    return s;
}

/* What the host backend has been asked for device 0 so far. */
static inline tally_host_calls_t host_calls(void)
{
    tally_host_calls_t c;
    assert_int_equal(tally_host_calls(0, &c), 0);
    return c;
}

/* The random workloads' draws: the next value of seed, and a block size
 * from it (a quarter of them 1 to 64 MiB and a bit, the rest up to 2 MiB). */
static inline unsigned next_draw(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return *seed;
}

static inline size_t drawn_size(unsigned draw)
{
    return (draw >> 4) % 4 == 0 ? (size_t)((draw >> 12) % 64 + 1) * MiB + (draw & 0xfff)
                                : (size_t)((draw >> 12) % (2 * MiB)) + 1;
}

/* One step of a random workload: the slot's block freed if it is live, else
 * a block of drawn_size(draw) allocated there (NULL when refused). Returns
 * the size asked, 0 for a free. */
static inline size_t toggle_slot(void **slot, unsigned draw, int device, void *stream)
{
    if (*slot) {
        tally_free(*slot);
        *slot = NULL;
        return 0;
    }
    size_t size = drawn_size(draw);
    *slot = tally_malloc(size, device, stream);
    return size;
}

/* Each test's setup. */
static inline int reset(void **state)
{
    (void)state;
    /* The runtime keys some tests change, back to this file's settings. */
    if (tally_configure("garbage_collection_threshold:0,expandable_grow_chunk_mb:2,expandable_handle_mb:0,"
                        "expandable_move_budget:-1,expandable_small_pages:true"))
        return -1;
    tally_empty_cache(-1);
    tally_reset_peak_stats(0);
    tally_reset_peak_stats(1);
    return 0;
}

static inline void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

#endif /* TALLY_TESTS_EXPANDUTIL_H */
