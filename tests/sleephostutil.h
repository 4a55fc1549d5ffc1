/* Shared by the tests of private tags, sleep and wake on the host backend
 * (test_api_sleep, test_api_sleep_errors; docs/sleep.md): the
 * configuration, the tag lists, each test's setup (every private tag awake,
 * sleep_alloc back to refuse, a clean slate) and four short-hands: a
 * device's reserved bytes, an allocation under a tag, the segment holding a
 * block, a tag's sleep info.
 *
 * Two simulated 1 GiB devices in backed mode (contents are real), with kv
 * and weights private through the configuration. */
#ifndef TALLY_TESTS_SLEEPHOSTUTIL_H
#define TALLY_TESTS_SLEEPHOSTUTIL_H

#include "ledgerutil.h"
#include "sleeputil.h"

#include "cache/cache.h"

#include <limits.h>
#include <signal.h>

#define MB LU_MiB
#define CONF "backend:host,host_devices:2,host_mode:backed,host_capacity:1GiB,private_tags:kv|weights"

static const char *KV[] = {"kv"}, *W[] = {"weights"};

static inline int setup(void **state)
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

static inline int64_t reserved(int device)
{
    return lu_stats(device).reserved_bytes[0].current;
}

static inline void *tagged(const char *tag, size_t size, int device)
{
    LU_OK(tally_tag_push(tag));
    void *p = tally_malloc(size, device, NULL);
    tally_tag_pop();
    if (!p)
        fail_msg("tally_malloc(%zu) under %s: %s", size, tag, tally_last_error());
    return p;
}

/* The segment holding p (its base, its size in *size), read from the cache
 * under its device's lock: tally_torch_base_alloc refuses a private tag's
 * pages (CUDA IPC cannot share them). */
static inline char *segment_of(const void *p, size_t *size)
{
    tally_block_info_t bi;
    LU_OK(tally_block_info(p, &bi));
    tally_device_t *d = tally__g.dev[bi.device];
    tally__dev_lock(&d->lock);
    tally_segment_t *s = tally__cache_segment_of_locked(d, (uintptr_t)p);
    char *base = s ? (char *)s->base : NULL;
    *size = s ? s->size : 0;
    tally__dev_unlock(&d->lock);
    assert_non_null(base);
    return base;
}

static inline tally_sleep_info_t info(const char *tag, int device)
{
    tally_sleep_info_t i;
    LU_OK(tally_tag_sleep_info(tag, device, &i));
    return i;
}

#endif /* TALLY_TESTS_SLEEPHOSTUTIL_H */
