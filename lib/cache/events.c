/* Stream uses and events (the cache's half of record_stream): which streams
 * a block was used on, the event recorded on each (on that stream's device)
 * when the block is freed, and the queue of pending events that holds the
 * block back until they complete; with CUDA graph capture, the events of a
 * block freed during a capture wait for its end (graph_pool.c tracks
 * captures). Every function here runs with the device's lock held. */
#include "cache/cache.h"

#include <string.h>

static tally_event_entry_t *entry_new(tally_device_t *d)
{
    tally_event_entry_t *e = d->spare_entries;
    if (e) {
        d->spare_entries = e->next;
        return e;
    }
    return tally__meta_alloc(sizeof *e);
}

/* An event of device dev goes back: to this device's spares, or to the
 * backend (which keeps spares per device) when it belongs to another. */
static void event_put_back(tally_device_t *d, int dev, void *event)
{
    if (dev != d->id) {
        tally__g.backend->event_destroy(dev, event);
        return;
    }
    if (d->nspare_events == d->cap_spare_events) {
        size_t cap = d->cap_spare_events ? d->cap_spare_events * 2 : 16;
        void **grown = tally__meta_grow(d->spare_events, d->nspare_events, cap, sizeof *grown);
        if (!grown) {
            tally__g.backend->event_destroy(d->id, event);
            return;
        }
        d->spare_events = grown;
        d->cap_spare_events = cap;
    }
    d->spare_events[d->nspare_events++] = event;
}

/* An event on device dev (the device of the stream it will be recorded
 * on), or NULL. */
static void *event_get(tally_device_t *d, int dev)
{
    void *ev = NULL;
    if (dev == d->id && d->nspare_events)
        return d->spare_events[--d->nspare_events];
    return tally__g.backend->event_create(dev, &ev) ? NULL : ev;
}

void tally__events_sync_use(const tally_use_t *u)
{
    const tally_backend_t *be = tally__g.backend;
    if (be->stream_sync)
        be->stream_sync(u->device, u->stream);
    else
        be->synchronize(u->device);
}

/* Record one event per stream the block was used on, each on its stream's
 * device; the block stays active until they complete. A use whose event
 * cannot be made or recorded is waited for at once (its stream). */
void tally__cache_insert_events_locked(tally_device_t *d, tally_block_t *b)
{
    for (uint16_t i = 0; i < b->nuses; i++) {
        const tally_use_t *u = &b->uses[i];
        void *ev = event_get(d, u->device);
        tally_event_entry_t *e = ev ? entry_new(d) : NULL;
        if (!e || tally__g.backend->event_record(u->device, ev, u->stream)) {
            if (ev)
                event_put_back(d, u->device, ev);
            tally__meta_free(e);
            tally__events_sync_use(u);
            continue;
        }
        e->event = ev;
        e->stream = u->stream;
        e->device = u->device;
        e->block = b;
        e->next = NULL;
        if (d->events_tail)
            d->events_tail->next = e;
        else
            d->events_head = e;
        d->events_tail = e;
        b->event_count++;
    }
    b->nuses = 0;
}

/* Whether (stream, device) is among the n streams already seen pending. */
static bool stream_blocked(const tally_use_t *blocked, int n, const tally_event_entry_t *e)
{
    for (int i = 0; i < n; i++)
        if (blocked[i].stream == e->stream && blocked[i].device == e->device)
            return true;
    return false;
}

/* Resolve completed events (all of them when wait is set); free blocks
 * whose last event completed. Without wait, a stream's events are looked at
 * in order and the first pending one stops that stream (PyTorch does the
 * same): later events of a stream cannot have completed before it. An
 * event whose query or synchronise fails is not left pending: the event's
 * device is synchronised and the block freed. Nothing is queried while a
 * CUDA graph capture may be under way (announced anywhere, or seen on the
 * device). */
void tally__events_process_locked(tally_device_t *d, bool wait)
{
    enum { MAX_BLOCKED = 32 };
    tally_use_t blocked[MAX_BLOCKED];
    int nblocked = 0;
    if (tally__capture_on_locked(d))
        return; /* queries and synchronises are potentially unsafe calls */
    tally_event_entry_t **link = &d->events_head, *last = NULL;
    while (*link) {
        tally_event_entry_t *e = *link;
        if (!wait && stream_blocked(blocked, nblocked, e)) {
            last = e;
            link = &e->next;
            continue;
        }
        int done = wait ? tally__g.backend->event_sync(e->device, e->event)
                        : tally__g.backend->event_query(e->device, e->event);
        if (done > 0) {
            if (nblocked == MAX_BLOCKED)
                break; /* the rest waits for the next look */
            blocked[nblocked].stream = e->stream;
            blocked[nblocked++].device = e->device;
            last = e;
            link = &e->next;
            continue;
        }
        *link = e->next;
        tally_block_t *b = e->block;
        if (done < 0)
            tally__g.backend->synchronize(e->device); /* the event is dropped, not reused */
        else
            event_put_back(d, e->device, e->event);
        e->next = d->spare_entries;
        d->spare_entries = e;
        if (--b->event_count == 0)
            tally__cache_free_block_locked(d, b);
    }
    if (!*link)
        d->events_tail = last;
}

/* The capture that deferred these blocks' events has ended: insert them
 * (pass-through: free them now, after their uses). */
static void flush_deferred(tally_device_t *d)
{
    size_t n = d->ndeferred;
    d->ndeferred = 0;
    for (size_t i = 0; i < n; i++) {
        tally_block_t *b = d->deferred[i];
        b->deferred = 0;
        if (tally__g.backend->passthrough) {
            tally__cache_passthrough_free_locked(d, b);
            continue;
        }
        tally__cache_insert_events_locked(d, b);
        if (!b->event_count)
            tally__cache_free_block_locked(d, b);
    }
}

/* Whether a capture is under way on the device (noting stream when it
 * captures, re-checking the streams known to capture); when none is, blocks whose
 * events were deferred get them now. check_stream: look at stream too. */
bool tally__events_capture_on_locked(tally_device_t *d, void *stream, bool check_stream)
{
    bool announced = atomic_load_explicit(&tally__g.announced, memory_order_acquire) > 0;
    bool on = false;
    /* Announcements are relied on once there were any: outside them no
     * driver call unless streams are still listed. */
    if (announced || !atomic_load_explicit(&tally__g.announces, memory_order_relaxed) || d->ncapturing)
        on = check_stream ? tally__capture_check_locked(d, stream) : tally__capture_underway_locked(d);
    on = on || announced;
    if (!on && TALLY_UNLIKELY(d->ndeferred))
        flush_deferred(d);
    return on;
}

/* Whether a capture is under way on the device or on a stream b was used
 * on (a capture that began since the last allocation is seen here too). */
bool tally__events_uses_captured_locked(tally_device_t *d, tally_block_t *b)
{
    bool on = atomic_load_explicit(&tally__g.announced, memory_order_acquire) > 0;
    if (!on && atomic_load_explicit(&tally__g.announces, memory_order_relaxed))
        return tally__events_capture_on_locked(d, NULL, false);
    for (uint16_t i = 0; i < b->nuses && !on; i++)
        on = tally__capture_check_locked(d, b->uses[i].stream);
    return on || tally__events_capture_on_locked(d, NULL, false);
}

void tally__events_wait_all_locked(tally_device_t *d)
{
    d->stats.num_sync_all_streams++;
    tally__events_process_locked(d, true);
}

/* Make stream (of device d) wait for the work queued so far on u's stream:
 * an event made and recorded on u's device (a wait may cross devices). */
void tally__events_wait_for_use_locked(tally_device_t *d, void *stream, const tally_use_t *u)
{
    const tally_backend_t *be = tally__g.backend;
    void *ev = event_get(d, u->device);
    if (!ev || be->event_record(u->device, ev, u->stream) || be->stream_wait(d->id, stream, ev))
        tally__events_sync_use(u); /* no event: wait for that stream instead */
    if (ev)
        event_put_back(d, u->device, ev);
}

/* The stream's device: NULL and the other default-stream handles mean the
 * current device's default stream, or the block's device when no device is
 * current (backend.h, docs/architecture.md); a NULL stream that is another
 * device's default stream is said (it is rarely what was meant). A stream
 * whose device cannot be told is still a use: kept on the block's device,
 * where no event can be recorded on it, so the free waits for that stream
 * (after the capture, if one is under way: frees with uses are deferred). */
int tally__cache_record_stream_locked(tally_device_t *d, tally_block_t *b, void *stream)
{
    const tally_backend_t *be = tally__g.backend;
    int dev = be->stream_device ? be->stream_device(stream, d->id) : d->id;
    if (dev < 0 || dev >= tally__g.ndev) {
        tally__diag("record_stream: cannot tell which device stream %p belongs to; block %p of device %d waits for "
                    "that stream when it is freed",
                    stream, (void *)b->addr, d->id);
        dev = d->id;
    } else if (TALLY_UNLIKELY(stream == NULL && dev != d->id)) {
        tally__diag("record_stream: the NULL stream is the default stream of the current device, device %d, not "
                    "that of block %p (device %d); pass the stream itself to record a use on device %d",
                    dev, (void *)b->addr, d->id, d->id);
    }
    if (stream == b->stream && dev == d->id)
        return 0;
    for (uint16_t i = 0; i < b->nuses; i++)
        if (b->uses[i].stream == stream && b->uses[i].device == dev)
            return 0;
    if (b->nuses == b->cap_uses) {
        if (b->cap_uses >= 4096)
            return tally__fail(TALLY_EINVAL, "record_stream: block %p already used on %u streams", (void *)b->addr,
                               b->nuses);
        uint16_t cap = b->cap_uses ? (uint16_t)(b->cap_uses * 2) : 4;
        tally_use_t *grown = tally__meta_grow(b->uses, b->nuses, cap, sizeof *grown);
        if (!grown)
            return tally__fail(TALLY_ENOMEM, "record_stream: out of host memory");
        b->uses = grown;
        b->cap_uses = cap;
    }
    b->uses[b->nuses].stream = stream;
    b->uses[b->nuses++].device = dev;
    return 0;
}
