/* The public entry points that take a block's pointer: tally_free,
 * tally_free_checked, tally_ignore, tally_record_stream and
 * tally_block_info. Each finds the live block on whichever device holds
 * it, and a pointer that is not one tells why: freed before (with the
 * first free's owner, from the device's freed-block ring), inside a live
 * block, or never tally's. */
#include "api/api.h"

#include <stdio.h>
#include <string.h>

/* ---- finding a block by pointer ----------------------------------------- */

static _Thread_local int last_device;

/* Lock the device holding a's live block, looking from device start on,
 * and return the block (the lock stays held), or NULL with no lock held.
 * take removes it from the map. Two passes: a device whose lock is biased
 * to another thread is looked at only after the others, since taking its
 * lock revokes the bias and the block is seldom there; the second pass
 * looks at every device the first did not, so a bias that comes or goes
 * meanwhile loses nothing. */
tally_block_t *tally__find_live_from(int start, uintptr_t a, bool take, tally_device_t **out)
{
    int n = tally__g.ndev;
    int i0 = start >= 0 && start < n ? start : 0;
    _Static_assert(TALLY_MAX_DEVICES <= 64, "the devices searched are one 64-bit mask");
    uint64_t seen = 0; /* bit i: device i searched */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0, i = i0; k < n; k++, i = i + 1 == n ? 0 : i + 1) {
            tally_device_t *d = tally__g.dev[i];
            if ((seen >> i & 1) || (pass == 0 && tally__dev_lock_biased_away(&d->lock)))
                continue;
            seen |= (uint64_t)1 << i;
            tally__dev_lock(&d->lock);
            tally_block_t *b = take ? tally__ptrmap_take(&d->map, a) : tally__ptrmap_get(&d->map, a);
            if (b) {
                last_device = i;
                *out = d;
                return b;
            }
            tally__dev_unlock(&d->lock);
        }
    }
    return NULL;
}

static tally_block_t *find_live(uintptr_t a, bool take, tally_device_t **out)
{
    return tally__find_live_from(last_device, a, take, out);
}

/* The newest record of a block freed at address a on device d, or NULL. */
static const tally_freed_t *freed_at_locked(tally_device_t *d, uintptr_t a)
{
    for (uint32_t k = 0; k < TALLY_FREED_RING; k++) {
        const tally_freed_t *f = &d->freed[(d->freed_next - 1 - k) % TALLY_FREED_RING];
        if (f->addr == a && f->seq)
            return f;
    }
    return NULL;
}

static int report_double_free(const char *fn, uintptr_t a, int device, tally_freed_t f)
{
    /* Only a free can be a double free; any other use is a use after free. */
    const char *what = strcmp(fn, "tally_free") == 0 ? "double free" : "use after free";
    return tally__fail(TALLY_EINVAL, "%s: %s of %p (device %d, %zu bytes, tag %s, stage %s, allocation #%llu)", fn,
                       what, (void *)a, device, f.size, tally__tag_name(f.tag), tally__stage_name(f.stage),
                       (unsigned long long)f.seq);
}

/* Why ptr is not a live block: a double free (naming its owner), a pointer
 * inside a segment, or one tally never returned. The device whose segment
 * holds the address decides: an address can be reused on another device
 * once a segment goes back to the backend. */
static int bad_pointer(const char *fn, uintptr_t a)
{
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        tally_segment_t *s = tally__cache_segment_of_locked(d, a);
        const tally_freed_t *f = s ? freed_at_locked(d, a) : NULL;
        tally_freed_t copy = f ? *f : (tally_freed_t){0};
        tally__dev_unlock(&d->lock);
        if (f)
            return report_double_free(fn, a, i, copy);
        if (s)
            return tally__fail(TALLY_EINVAL,
                               "%s: %p is inside a segment of device %d but is not the start of a live block "
                               "(double free or interior pointer)",
                               fn, (void *)a, i);
    }
    /* No segment holds it: a block whose segment was since released? */
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        const tally_freed_t *f = freed_at_locked(d, a);
        tally_freed_t copy = f ? *f : (tally_freed_t){0};
        tally__dev_unlock(&d->lock);
        if (f)
            return report_double_free(fn, a, i, copy);
    }
    return tally__fail(TALLY_EINVAL, "%s: pointer %p was not allocated by tally", fn, (void *)a);
}

void tally_free(void *ptr)
{
    if (!ptr || tally__ensure_init())
        return;
    tally_device_t *d;
    tally_block_t *b = find_live((uintptr_t)ptr, true, &d);
    if (!b) {
        bad_pointer("tally_free", (uintptr_t)ptr);
        return;
    }
    tally__cache_free_locked(d, b);
    tally__dev_unlock(&d->lock);
}

int tally_ignore(void *ptr)
{
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    tally_device_t *d;
    tally_block_t *b = ptr ? find_live((uintptr_t)ptr, false, &d) : NULL;
    if (!b)
        return ptr ? bad_pointer("tally_ignore", (uintptr_t)ptr) : tally__fail(TALLY_EINVAL, "tally_ignore: ptr is NULL");
    b->ignored = 1;
    tally__dev_unlock(&d->lock);
    return 0;
}

int tally_free_checked(void *ptr, size_t size, int device)
{
    if (!ptr)
        return 0;
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    tally_device_t *d;
    tally_block_t *b = find_live((uintptr_t)ptr, true, &d);
    if (!b)
        return bad_pointer("tally_free", (uintptr_t)ptr);
    size_t req = b->requested;
    tally__cache_free_locked(d, b);
    tally__dev_unlock(&d->lock);
    if (device != d->id)
        return tally__fail(TALLY_EINVAL, "tally_free: %p belongs to device %d, not %d as the caller says (freed anyway)",
                           ptr, d->id, device);
    if (size != req)
        return tally__fail(TALLY_EINVAL, "tally_free: %p was allocated with %zu bytes, not %zu as the caller says "
                           "(freed anyway)", ptr, req, size);
    return 0;
}

int tally_record_stream(void *ptr, void *stream)
{
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    if (!ptr)
        return tally__fail(TALLY_EINVAL, "tally_record_stream: pointer is NULL");
    tally_device_t *d;
    tally_block_t *b = find_live((uintptr_t)ptr, false, &d);
    if (!b)
        return bad_pointer("tally_record_stream", (uintptr_t)ptr);
    rc = tally__cache_record_stream_locked(d, b, stream);
    tally__dev_unlock(&d->lock);
    return rc;
}

int tally_block_info(const void *ptr, tally_block_info_t *info)
{
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    if (!ptr || !info)
        return tally__fail(TALLY_EINVAL, "tally_block_info: NULL argument");
    tally_device_t *d;
    tally_block_t *b = find_live((uintptr_t)ptr, false, &d);
    if (!b)
        return tally__fail_quiet(TALLY_EINVAL, "tally_block_info: %p is not a live block", ptr);
    info->device = d->id;
    info->stream = b->stream;
    info->requested_size = b->requested;
    info->size = b->size;
    info->tag = b->tag;
    info->stage = b->stage;
    info->seq = b->seq;
    tally__dev_unlock(&d->lock);
    return 0;
}
