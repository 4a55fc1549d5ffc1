/* Statistics resets and reads with PyTorch's definitions: a peak reset sets
 * every peak to its current value; an accumulated reset makes allocated and
 * freed read 0 and zeroes the event counters, leaving current and peak
 * alone. Each statistic keeps only totals that grow (internal.h), so the
 * accumulated reset is a base subtracted when the statistics are read. And
 * the all-pools entries, which the hot path leaves to their peaks, summed
 * from the pools' before a read or a reset. */
#include "core/internal.h"

static void each_stat(tally_stats_t *s, const tally_stats_t *other, void (*fn)(tally_stat_t *, const tally_stat_t *))
{
#define TALLY_X_(name)                                                                                             \
    for (int p = 0; p < TALLY_POOL_COUNT; p++)                                                                     \
        fn(&s->name[p], other ? &other->name[p] : NULL);
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    fn(&s->oversize_allocations, other ? &other->oversize_allocations : NULL);
    fn(&s->oversize_segments, other ? &other->oversize_segments : NULL);
}

static void current_now(tally_stat_t *st, const tally_stat_t *unused)
{
    (void)unused;
    st->current = tally__stat_now(st);
}

static void peak_to_current(tally_stat_t *st, const tally_stat_t *unused)
{
    (void)unused;
    st->peak = st->current;
}

/* base takes st's totals. */
static void base_from(tally_stat_t *base, const tally_stat_t *st)
{
    base->allocated = st->allocated;
    base->freed = st->freed;
}

static void less_base(tally_stat_t *st, const tally_stat_t *base)
{
    st->allocated -= base->allocated;
    st->freed -= base->freed;
}

static void sync_one(tally_stat_t *arr)
{
    const tally_stat_t *sm = &arr[TALLY_POOL_SMALL], *lg = &arr[TALLY_POOL_LARGE];
    arr[TALLY_POOL_ALL].allocated = sm->allocated + lg->allocated;
    arr[TALLY_POOL_ALL].freed = sm->freed + lg->freed;
}

void tally__stats_sync_all(tally_stats_t *s)
{
#define TALLY_X_(name) sync_one(s->name);
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    each_stat(s, NULL, current_now);
}

void tally__stats_reset_peak(tally_stats_t *s)
{
    each_stat(s, NULL, peak_to_current);
}

void tally__stats_reset_accumulated(tally_stats_t *s, tally_stats_t *base)
{
    each_stat(base, s, base_from);
    s->num_alloc_retries = 0;
    s->num_ooms = 0;
    s->num_sync_all_streams = 0;
    s->num_device_alloc = 0;
    s->num_device_free = 0;
}

void tally__stats_read(const tally_stats_t *s, const tally_stats_t *base, tally_stats_t *out)
{
    *out = *s;
    each_stat(out, base, less_base);
}
