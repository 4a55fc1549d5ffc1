/* Statistics resets with PyTorch's definitions: a peak reset sets every peak
 * to its current value; an accumulated reset zeroes allocated / freed and the
 * event counters, leaving current and peak alone. And the all-pools entries,
 * which the hot path leaves to their peaks (internal.h), summed from the
 * pools' before a read or a reset. */
#include "core/internal.h"

static void each_stat(tally_stats_t *s, void (*fn)(tally_stat_t *))
{
#define TALLY_X_(name) for (int p = 0; p < TALLY_POOL_COUNT; p++) fn(&s->name[p]);
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
    fn(&s->oversize_allocations);
    fn(&s->oversize_segments);
}

static void peak_to_current(tally_stat_t *st)
{
    st->peak = st->current;
}

static void zero_accumulated(tally_stat_t *st)
{
    st->allocated = 0;
    st->freed = 0;
}

static void sync_one(tally_stat_t *arr)
{
    const tally_stat_t *sm = &arr[TALLY_POOL_SMALL], *lg = &arr[TALLY_POOL_LARGE];
    arr[TALLY_POOL_ALL].current = sm->current + lg->current;
    arr[TALLY_POOL_ALL].allocated = sm->allocated + lg->allocated;
    arr[TALLY_POOL_ALL].freed = sm->freed + lg->freed;
}

void tally__stats_sync_all(tally_stats_t *s)
{
#define TALLY_X_(name) sync_one(s->name);
    TALLY_POOL_STATS(TALLY_X_)
#undef TALLY_X_
}

void tally__stats_reset_peak(tally_stats_t *s)
{
    tally__stats_sync_all(s);
    each_stat(s, peak_to_current);
}

void tally__stats_reset_accumulated(tally_stats_t *s)
{
    tally__stats_sync_all(s);
    each_stat(s, zero_accumulated);
    s->num_alloc_retries = 0;
    s->num_ooms = 0;
    s->num_sync_all_streams = 0;
    s->num_device_alloc = 0;
    s->num_device_free = 0;
}
