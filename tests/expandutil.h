/* Shared by the expandable-segment tests on the host backend
 * (test_cache_expand_pages, test_cache_expand_handles): their
 * configuration, the page size, a stream, statistics, the setup that puts
 * the runtime keys back before each test, and a sink that drops what it is
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
