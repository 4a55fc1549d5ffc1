/* Statistics resets with PyTorch's definitions: a peak reset sets every peak
 * to its current value; an accumulated reset zeroes allocated / freed and the
 * event counters, leaving current and peak alone. */
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

void tally__stats_reset_peak(tally_stats_t *s)
{
    each_stat(s, peak_to_current);
}

void tally__stats_reset_accumulated(tally_stats_t *s)
{
    each_stat(s, zero_accumulated);
    s->num_alloc_retries = 0;
    s->num_ooms = 0;
    s->num_sync_all_streams = 0;
    s->num_device_alloc = 0;
    s->num_device_free = 0;
}
