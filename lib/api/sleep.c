/* Private tags, sleep and wake: the public entry points (docs/sleep.md).
 *
 * The API knows which tags are private (the private_tags key and
 * tally_tag_set_private) and gives each one's blocks a private pool on the
 * device, keyed by the tag's id: the cache sees only that id
 * (lib/cache/private.c). tally_sleep and tally_wake check every tag first,
 * then work device by device under one device lock at a time. */
#include "api/api.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define MAX_PRIVATE 64

/* Append-only: readers load the count, then read that many ids. */
static uint32_t private_ids[MAX_PRIVATE];
_Atomic int tally__nprivate; /* read inline by api.h's tally__private_any */
#define nprivate tally__nprivate
static tally_mutex_t private_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__private_lock(void) { return &private_lock; }

static bool listed(uint32_t id)
{
    int n = atomic_load_explicit(&nprivate, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (private_ids[i] == id)
            return true;
    return false;
}

static int add_private(uint32_t id, const char *fn, const char *name)
{
    tally__mutex_lock(&private_lock);
    int rc = 0;
    if (!listed(id)) {
        int n = atomic_load(&nprivate);
        if (n == MAX_PRIVATE) {
            rc = tally__fail(TALLY_ESTATE, "%s: '%s': at most %d tags can be private", fn, name, MAX_PRIVATE);
        } else {
            private_ids[n] = id;
            atomic_store_explicit(&nprivate, n + 1, memory_order_release);
            tally__alloc_extra_update();
        }
    }
    tally__mutex_unlock(&private_lock);
    return rc;
}

/* Why backend be cannot hold private tags, or NULL. */
static const char *refusal(const tally_backend_t *be)
{
    if (be->passthrough || !be->reserve || !be->map)
        return "passes allocations through to CUDA's stream-ordered pools: it has no pages of its own to give a "
               "tag, nor to unmap while the addresses stay reserved (use backend cuda or host)";
    return NULL;
}

int tally__private_init_locked(const tally_backend_t *be, char *err, size_t errlen)
{
    const char *list = tally__opt.private_tags;
    if (!list[0])
        return 0;
    const char *why = refusal(be);
    if (why) {
        snprintf(err, errlen, "private_tags: backend %s %s", be->name, why);
        return -TALLY_ECONF;
    }
    for (const char *p = list; *p;) {
        const char *end = strchr(p, '|');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char name[256]; /* tag names are at most 200 bytes (names.c) */
        if (len == 0) {
            snprintf(err, errlen, "private_tags: an empty tag name in '%s'", list);
            return -TALLY_ECONF;
        }
        if (len > 200) { /* the reason first: the list may be long */
            snprintf(err, errlen, "private_tags: tag name '%.40s...' is longer than 200 characters", p);
            return -TALLY_ECONF;
        }
        memcpy(name, p, len);
        name[len] = 0;
        uint32_t id;
        if (tally__intern_tag(name, &id) || id == TALLY_TAG_NONE) {
            snprintf(err, errlen, "private_tags: '%s' cannot be private: %s", name,
                     id == TALLY_TAG_NONE ? "it is the untagged row" : tally_last_error());
            return -TALLY_ECONF;
        }
        if (add_private(id, "private_tags", name)) {
            snprintf(err, errlen, "%s", tally_last_error());
            return -TALLY_ECONF;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

/* ---- allocation ------------------------------------------------------------------------- */

static int wake_one(uint32_t id);

int tally__private_for_alloc(int device, uint32_t *id_out)
{
    *id_out = 0;
    uint32_t id = tally__current_tag();
    if (id == TALLY_TAG_NONE || !listed(id))
        return 0;
    tally_device_t *d = tally__g.dev[device];
    tally__dev_lock(&d->lock);
    tally_gpool_t *gp = tally__ppool_get_locked(d, id, false);
    bool asleep = gp && tally__ppool_asleep(gp);
    tally__dev_unlock(&d->lock);
    if (asleep) {
        if (TALLY_OPT(sleep_alloc) != TALLY_SLEEP_ALLOC_WAKE)
            return tally__fail(TALLY_ESTATE,
                               "tally_malloc: tag '%s' is asleep on device %d: wake it first (tally_wake), or set "
                               "sleep_alloc:wake to wake it on allocation",
                               tally__tag_name(id), device);
        tally__diag("tally_malloc: tag '%s' is asleep: waking it for an allocation (sleep_alloc:wake)",
                    tally__tag_name(id));
        int rc = wake_one(id);
        if (rc)
            return rc;
    }
    *id_out = id;
    return 0;
}

/* ---- marking ---------------------------------------------------------------------------- */

static int lookup_name(const char *fn, const char *tag, uint32_t *id)
{
    if (!tag)
        return tally__fail(TALLY_EINVAL, "%s: tag is NULL", fn);
    int rc = tally__intern_tag(tag, id);
    if (rc)
        return tally__fail(-rc, "%s: %s", fn, tally_last_error());
    return 0;
}

int tally_tag_set_private(const char *tag)
{
    uint32_t id;
    int rc = lookup_name("tally_tag_set_private", tag, &id);
    if (rc)
        return rc;
    if (id == TALLY_TAG_NONE)
        return tally__fail(TALLY_EINVAL, "tally_tag_set_private: 'untagged' is every untagged block: it cannot be "
                           "private");
    if ((rc = tally__ensure_init()))
        return rc;
    const char *why = refusal(tally__g.backend);
    if (why)
        return tally__fail(TALLY_ESTATE, "tally_tag_set_private: '%s': backend %s %s", tag, tally__g.backend->name,
                           why);
    return add_private(id, "tally_tag_set_private", tag);
}

int tally_tag_is_private(const char *tag)
{
    uint32_t id;
    int rc = lookup_name("tally_tag_is_private", tag, &id);
    if (rc)
        return rc;
    return listed(id) ? 1 : 0;
}

/* ---- sleep and wake --------------------------------------------------------------------- */

/* The timeline's event for a sleep (size: the bytes now unmapped) or a wake
 * (size: the bytes now mapped), owned by the tag. */
static void timeline(tally_device_t *d, int action, tally_gpool_t *gp, uint32_t id)
{
    if (!TALLY_OPT(timeline))
        return;
    tally_ppool_info_t in;
    tally__ppool_info_locked(d, gp, &in);
    tally__timeline_record_locked(d, action, 0, action == TALLY_EV_SLEEP ? in.unmapped : in.reserved, NULL, id,
                                  tally__stage_now(), NULL);
}

/* Sleeps and wakes, numbered, in a ring of the last NOTES; each open stage
 * keeps the number it began at in its frame (tally__stage_begin's mark), and
 * its report names those after it. */
#define NOTES 64
typedef struct note {
    uint32_t tag;
    bool slept, offload;
} note_t;
static note_t notes[NOTES];
static uint64_t nnotes;

void tally__private_note(uint32_t tag, bool slept, bool offload)
{
    tally__mutex_lock(&private_lock);
    notes[nnotes++ % NOTES] = (note_t){tag, slept, offload};
    tally__mutex_unlock(&private_lock);
}

uint64_t tally__private_notes_mark(void)
{
    tally__mutex_lock(&private_lock);
    uint64_t n = nnotes;
    tally__mutex_unlock(&private_lock);
    return n;
}

void tally__private_write_notes(tally_out_t *o, const char *stage, uint64_t from)
{
    tally__mutex_lock(&private_lock);
    uint64_t skipped = nnotes - from > NOTES ? nnotes - from - NOTES : 0;
    if (nnotes > from) {
        tally__out_printf(o, "tally: stage %s: private tags", stage);
        for (uint64_t n = from + skipped; n < nnotes; n++) {
            const note_t *e = &notes[n % NOTES];
            tally__out_printf(o, "%s %s %s", n > from + skipped ? "," : "", tally__tag_name(e->tag),
                              !e->slept ? "woke" : e->offload ? "slept (offloaded to host)" : "slept (discarded)");
        }
        if (skipped)
            tally__out_printf(o, " (and %llu earlier)", (unsigned long long)skipped);
        tally__out_puts(o, "\n");
    }
    tally__mutex_unlock(&private_lock);
}

/* Why the tag's blocks on d cannot sleep, or 0: blocks outside its private
 * pool (a graph pool's, or taken before it became private). (Its own
 * segments are never shared with another process: tally_torch_base_alloc
 * refuses pages of the virtual memory API, which CUDA IPC cannot share.)
 * Under d's lock. */
static int check_blocks_locked(tally_device_t *d, uint32_t id, tally_gpool_t *gp, char *why, size_t whylen)
{
    for (tally_segment_t *s = d->segments; s; s = s->next) {
        if (s->gp == gp && gp)
            continue;
        for (tally_block_t *b = s->head; b; b = b->next) {
            if (b->state == BLOCK_FREE || b->state == BLOCK_LENT || b->tag != id)
                continue;
            if (s->gp && !s->gp->private_id)
                snprintf(why, whylen, "its block %p on device %d belongs to a CUDA graph's pool (%llu, %llu): "
                         "a graph replay would use it", (void *)b->addr, d->id, (unsigned long long)s->gp->hi,
                         (unsigned long long)s->gp->lo);
            else
                snprintf(why, whylen, "its block %p on device %d was allocated before the tag became private, "
                         "on pages other tags' blocks may share", (void *)b->addr, d->id);
            return TALLY_ESTATE;
        }
    }
    if (gp && tally__capture_on_locked(d)) {
        snprintf(why, whylen, "a CUDA graph capture is under way on device %d", d->id);
        return TALLY_ESTATE;
    }
    return 0;
}

static int resolve(const char *fn, const char *const *tags, int ntags, uint32_t *ids)
{
    if (!tags || ntags <= 0 || ntags > MAX_PRIVATE)
        return tally__fail(TALLY_EINVAL, "%s: %s", fn,
                           !tags ? "tags is NULL" : "ntags must be 1 to 64");
    for (int i = 0; i < ntags; i++) {
        int rc = lookup_name(fn, tags[i], &ids[i]);
        if (rc)
            return rc;
        if (!listed(ids[i]))
            return tally__fail(TALLY_EINVAL,
                               "%s: tag '%s' is not private: its blocks may share pages with other tags' blocks; "
                               "mark it private (private_tags, tally_tag_set_private, tally.tag(name, private=True)) "
                               "before it allocates",
                               fn, tags[i]);
    }
    return 0;
}

/* Wait for the tag's streams on d without holding d's lock, so that other
 * threads keep allocating meanwhile; the sleep itself waits again, under
 * the lock, for what was queued since (usually nothing). */
static void wait_unlocked(tally_device_t *d, uint32_t id)
{
    const tally_backend_t *be = tally__g.backend;
    tally_use_t streams[64];
    tally__dev_lock(&d->lock);
    tally_gpool_t *gp = tally__ppool_get_locked(d, id, false);
    int n = gp && !tally__ppool_asleep(gp) ? tally__ppool_streams_locked(d, gp, streams, 64) : 0;
    tally__dev_unlock(&d->lock);
    for (int i = 0; i < n && be->stream_sync; i++)
        be->stream_sync(streams[i].device, streams[i].stream);
}

int tally_sleep(const char *const *tags, int ntags, int flags)
{
    uint32_t ids[MAX_PRIVATE];
    int rc = resolve("tally_sleep", tags, ntags, ids);
    if (rc)
        return rc;
    if (flags & ~(TALLY_SLEEP_OFFLOAD | TALLY_SLEEP_SYNC_DEVICE))
        return tally__fail(TALLY_EINVAL, "tally_sleep: unknown flags 0x%x (TALLY_SLEEP_OFFLOAD, TALLY_SLEEP_SYNC_DEVICE)",
                           (unsigned)flags);
    if ((rc = tally__ensure_init()))
        return rc;
    bool offload = flags & TALLY_SLEEP_OFFLOAD, sync_device = flags & TALLY_SLEEP_SYNC_DEVICE;
    char why[320];
    /* Check every tag on every device before anything sleeps. */
    for (int i = 0; i < ntags; i++)
        for (int k = 0; k < tally__g.ndev; k++) {
            tally_device_t *d = tally__g.dev[k];
            tally__dev_lock(&d->lock);
            rc = check_blocks_locked(d, ids[i], tally__ppool_get_locked(d, ids[i], false), why, sizeof why);
            tally__dev_unlock(&d->lock);
            if (rc)
                return tally__fail(rc, "tally_sleep: tag '%s' cannot sleep: %s", tags[i], why);
        }
    for (int i = 0; i < ntags; i++) {
        int slept = 0, already = 0;
        uint64_t held = 0;
        for (int k = 0; k < tally__g.ndev; k++) {
            tally_device_t *d = tally__g.dev[k];
            if (!sync_device)
                wait_unlocked(d, ids[i]);
            tally__dev_lock(&d->lock);
            /* The tag sleeps on every device, those where it holds nothing
             * yet too: an allocation there is refused (or wakes it) alike. */
            tally_gpool_t *gp = tally__ppool_get_locked(d, ids[i], true);
            rc = gp ? 0 : TALLY_ENOMEM;
            if (!gp) {
                snprintf(why, sizeof why, "out of host memory");
            } else if (tally__ppool_asleep(gp)) {
                already++;
            } else {
                tally_ppool_info_t in;
                tally__ppool_info_locked(d, gp, &in);
                held += in.reserved;
                rc = tally__ppool_sleep_locked(d, gp, offload, sync_device, why, sizeof why);
                if (!rc) {
                    slept++;
                    timeline(d, TALLY_EV_SLEEP, gp, ids[i]);
                }
            }
            tally__dev_unlock(&d->lock);
            if (rc)
                return tally__fail(rc, "tally_sleep: tag '%s' on device %d: %s (nothing of it was unmapped)",
                                   tags[i], k, why);
        }
        if (already && !slept)
            tally__diag("tally_sleep: tag '%s' is already asleep: nothing done", tags[i]);
        else if (!held)
            tally__diag("tally_sleep: tag '%s' holds no memory: it sleeps with nothing to unmap", tags[i]);
        if (slept)
            tally__private_note(ids[i], true, offload);
    }
    return 0;
}

static int wake_id(const char *name, uint32_t id)
{
    int woke = 0, awake = 0;
    for (int k = 0; k < tally__g.ndev; k++) {
        tally_device_t *d = tally__g.dev[k];
        tally__dev_lock(&d->lock);
        tally_gpool_t *gp = tally__ppool_get_locked(d, id, false);
        int rc = 0;
        uint64_t missing = 0;
        char why[320];
        if (gp && !tally__ppool_asleep(gp)) {
            awake++;
        } else if (gp) {
            rc = tally__ppool_wake_locked(d, gp, &missing, why, sizeof why);
            if (!rc) {
                woke++;
                timeline(d, TALLY_EV_WAKE, gp, id);
            }
        }
        tally__dev_unlock(&d->lock);
        if (rc == TALLY_ENOMEM) {
            char m[32];
            tally__fmt_bytes(missing, m, sizeof m);
            return tally__fail(rc, "tally_wake: tag '%s' on device %d: out of memory, %s missing (%s); it stays "
                               "asleep with its backup",
                               name, k, m, why);
        }
        if (rc)
            return tally__fail(rc, "tally_wake: tag '%s' on device %d: %s; it stays asleep with its backup", name,
                               k, why);
    }
    if (!woke)
        tally__diag("tally_wake: tag '%s' is %s: nothing done", name, awake ? "awake" : "not asleep");
    else
        tally__private_note(id, false, false);
    return 0;
}

static int wake_one(uint32_t id)
{
    return wake_id(tally__tag_name(id), id);
}

int tally_wake(const char *const *tags, int ntags)
{
    uint32_t ids[MAX_PRIVATE];
    int rc = resolve("tally_wake", tags, ntags, ids);
    if (rc)
        return rc;
    if ((rc = tally__ensure_init()))
        return rc;
    for (int i = 0; i < ntags; i++)
        if ((rc = wake_id(tags[i], ids[i])))
            return rc;
    return 0;
}

int tally_tag_sleep_info(const char *tag, int device, tally_sleep_info_t *out)
{
    uint32_t id;
    if (!out)
        return tally__fail(TALLY_EINVAL, "tally_tag_sleep_info: out is NULL");
    int rc = lookup_name("tally_tag_sleep_info", tag, &id);
    if (rc)
        return rc;
    if ((rc = tally__ensure_init()))
        return rc;
    if (device < -1 || device >= tally__g.ndev)
        return tally__fail(TALLY_EINVAL, "tally_tag_sleep_info: device %d does not exist", device);
    memset(out, 0, sizeof *out);
    out->is_private = listed(id);
    for (int k = 0; k < tally__g.ndev; k++) {
        if (device >= 0 && k != device)
            continue;
        tally_device_t *d = tally__g.dev[k];
        tally__dev_lock(&d->lock);
        tally_gpool_t *gp = tally__ppool_get_locked(d, id, false);
        tally_ppool_info_t in = {0};
        if (gp)
            tally__ppool_info_locked(d, gp, &in);
        tally__dev_unlock(&d->lock);
        out->asleep |= in.asleep;
        out->offloaded |= in.offloaded;
        out->reserved += in.reserved;
        out->sleeping += in.sleeping;
        out->sleeping_blocks += in.sleeping_blocks;
        out->unmapped += in.unmapped;
        out->offload += in.offload;
        out->kept += in.kept;
        out->sleeps += in.sleeps;
        out->wakes += in.wakes;
    }
    return 0;
}
