/* Expandable segments (expandable_segments:true): the large pool of each
 * stream lives in one reserved address range of 1 1/8 times the device's
 * memory (as PyTorch's: room for a block placed past a hole whose pages
 * moved away, so a device that holds the pages is never refused for want of
 * addresses at the range's end), and physical memory is mapped into it in 2 MiB pages only where blocks are in
 * use. Blocks split and merge as usual, so holes merge across what would
 * have been segment boundaries; and a page that no live block touches is
 * "idle". When new pages would take reserved memory above its high-water
 * mark, idle pages are unmapped first, so the memory a hole holds moves to
 * where it is needed instead of adding to the peak; below the mark, idle
 * pages stay mapped (fewer map calls when the hole is used again). Peak
 * reserved memory is then about the peak of the pages live blocks touch,
 * not of the sum of segments. Every segment here belongs to the large pool.
 *
 * Backend calls: idle pages are taken back in whole runs, the longest
 * first, so one unmap call frees many pages; when no idle page is left,
 * whole free small-pool segments are released instead (their memory moves
 * too); with moves unlimited (-1), a new small-pool segment that would
 * pass the mark takes them the same way (tally__expand_make_room_locked),
 * but a region's last idle run after the others and only the handles it
 * needs of it.
 * A block that maps new pages also maps, in the same call, the free
 * unmapped pages after it that fit under the mark (the room a whole run
 * left); a block under 10 MiB that grows the range maps up to the next
 * expandable_grow_chunk_mb boundary (20 MiB: what PyTorch's default
 * placement would give it as a segment; those pages do not raise the mark).
 * cache.c prefers a free block already on mapped pages among the few after
 * the best fit.
 *
 * Moves cost driver calls (an unmap there, a map here), and a repeating job
 * made them every step (issue 21: about 1,000 per ddp step). So they are
 * made only within expandable_move_budget (expand_move.c, with the steals
 * and the steady-state detector), the modelled driver time a step
 * may spend on them; 0 (the default) makes none: reserved memory then grows
 * to what the step's placement touches, after which a step maps nothing.
 * Unless moves are unlimited (-1) pages are mapped in large physical
 * handles, which cuts the driver calls of growth to one cuMemCreate per
 * handle: with no moves, a handle per 20 MiB cell of the region a run
 * crosses (expandable_handle_grid_mb; map_cells), so empty_cache can unmap
 * the cells no live block touches; within a finite budget one handle per
 * map call (moves take whole idle handles).
 *
 * Physical handles: a map call lays its pages out in handles (backend.h),
 * and a handle can only be unmapped whole (CUDA's cuMemUnmap). Small blocks
 * get a handle per 2 MiB page; a block of at least expandable_handle_mb
 * (64 MiB) maps each run of its new pages as one handle, so a large block
 * costs one cuMemCreate + cuMemMap instead of one per page (pages mapped
 * ahead of it go in a call of their own, a handle per page). Per page the
 * region knows its handle (first page, length, idle pages); a handle is
 * "spare" when every page of it is idle, and only spare handles are ever
 * unmapped: stealing, trimming and the undo of a failed map take whole
 * spare handles, and the idle pages of a handle that still holds a live
 * block stay mapped until it is spare.
 *
 * CUDA graph capture: nothing is unmapped while a capture may be under way
 * (tally__capture_on_locked: one announced, or a stream of the device seen
 * capturing; tests of counters when none is): cuMemUnmap needs the
 * segment's stream synchronised first, which a capture forbids (it would
 * invalidate it). A block that needs pages then maps new
 * ones instead of taking idle ones, past the high-water mark if need be;
 * when the device has no room for them the allocation fails with OOM (the
 * capture survives). empty_cache, stage-end release and the release of a
 * whole region leave their pages mapped (a diagnostic says so; the figure
 * released counts only what went); the next release after the capture
 * gives them back, and stealing resumes at the next allocation.
 *
 * Requires a backend with reserve / map / unmap (host and cuda). Runs with
 * the device lock held. */
#include "ledger/ledger.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE ((size_t)2 << 20)

static inline void idle_set(tally_expand_t *ex, size_t p)
{
    ex->idle_bits[p >> 6] |= 1ull << (p & 63);
}

static inline void idle_clear(tally_expand_t *ex, size_t p)
{
    ex->idle_bits[p >> 6] &= ~(1ull << (p & 63));
}

/* Mark handle h (its first page) spare or not. */
static void spare_handle(tally_expand_t *ex, size_t h, bool on)
{
    size_t n = ex->hlen[h];
    for (size_t q = h; q < h + n; q++) {
        if (on)
            ex->spare_bits[q >> 6] |= 1ull << (q & 63);
        else
            ex->spare_bits[q >> 6] &= ~(1ull << (q & 63));
    }
    if (on)
        ex->spare += n;
    else
        ex->spare -= n;
}

/* Mapped page p: the last live block on it went (idle) or the first came. */
static void page_idle(tally_expand_t *ex, size_t p)
{
    ex->idle++;
    idle_set(ex, p);
    size_t h = ex->hstart[p];
    if (++ex->hidle[h] == ex->hlen[h])
        spare_handle(ex, h, true);
}

static void page_live(tally_expand_t *ex, size_t p)
{
    ex->idle--;
    idle_clear(ex, p);
    size_t h = ex->hstart[p];
    if (ex->hidle[h]-- == ex->hlen[h])
        spare_handle(ex, h, false);
}

/* Highest reserved bytes each device has reached (never reset). */
static uint64_t high_water[TALLY_MAX_DEVICES];

bool tally__expand_on(void)
{
    return tally__opt.expandable_segments && tally__g.backend->map != NULL;
}

static void page_span(const tally_segment_t *s, const tally_block_t *b, size_t *first, size_t *last)
{
    *first = (b->addr - s->base) / PAGE;
    *last = (b->addr - s->base + b->size - 1) / PAGE;
}

/* The stream's region, created on first use: one free block spanning it,
 * in the large pool. Returns 0, or TALLY_ENOMEM / TALLY_EBACKEND. */
int tally__expand_region_locked(tally_device_t *d, void *stream, tally_block_t *(*new_block)(tally_device_t *),
                                char *why, size_t whylen)
{
    for (tally_segment_t *s = d->segments; s; s = s->next)
        if (s->ex && s->stream == stream)
            return 0;
    size_t free_b = 0, total = 0;
    if (tally__g.backend->mem_info(d->id, &free_b, &total) || total == 0) {
        snprintf(why, whylen, "cannot read the memory of device %d for an expandable segment", d->id);
        return TALLY_EBACKEND;
    }
    size_t va = (total + total / 8 + PAGE - 1) / PAGE * PAGE;
    void *base = NULL;
    int rc = tally__g.backend->reserve(d->id, va, &base, why, whylen);
    if (rc)
        return rc;
    tally_segment_t *s = tally__meta_calloc(sizeof *s);
    tally_expand_t *ex = tally__meta_calloc(sizeof *ex);
    size_t npages = va / PAGE;
    uint8_t *mapped = tally__meta_calloc(npages);
    uint32_t *live = tally__meta_calloc(npages * sizeof *live);
    uint64_t *idle_bits = tally__meta_calloc((npages / 64 + 1) * sizeof *idle_bits);
    uint64_t *spare_bits = tally__meta_calloc((npages / 64 + 1) * sizeof *spare_bits);
    uint32_t *hstart = tally__meta_calloc(npages * sizeof *hstart);
    uint32_t *hlen = tally__meta_calloc(npages * sizeof *hlen);
    uint32_t *hidle = tally__meta_calloc(npages * sizeof *hidle);
    bool meta = s && ex && mapped && live && idle_bits && spare_bits && hstart && hlen && hidle;
    tally_block_t *b = meta ? new_block(d) : NULL;
    if (!b) {
        tally__meta_free(s);
        tally__meta_free(ex);
        tally__meta_free(mapped);
        tally__meta_free(live);
        tally__meta_free(idle_bits);
        tally__meta_free(spare_bits);
        tally__meta_free(hstart);
        tally__meta_free(hlen);
        tally__meta_free(hidle);
        tally__g.backend->unreserve(d->id, base, va);
        snprintf(why, whylen, "out of host memory for an expandable segment");
        return TALLY_ENOMEM;
    }
    ex->npages = npages;
    ex->mapped = mapped;
    ex->live = live;
    ex->idle_bits = idle_bits;
    ex->spare_bits = spare_bits;
    ex->hstart = hstart;
    ex->hlen = hlen;
    ex->hidle = hidle;
    s->base = (uintptr_t)base;
    s->size = va;
    s->stream = stream;
    s->pool = TALLY_POOL_LARGE;
    s->device = d->id;
    s->head = b;
    s->ex = ex;
    tally__segment_link_locked(d, s);
    tally__block_place(b, s, s->base, va, NULL);
    b->state = BLOCK_FREE;
    tally__pool_insert(&d->large, b);
    tally__stat_pool_inc(d->stats.segment, TALLY_POOL_LARGE, 1);
    return 0;
}

/* Map pages [p, p + n) in one backend call, in handles of hp pages (the
 * last may be shorter); the last `ahead` of them are mapped ahead of need
 * and do not raise the high-water mark. The new pages are idle (spare). */
static int map_run(tally_device_t *d, tally_segment_t *s, size_t p, size_t n, size_t hp, size_t ahead, char *why,
                   size_t whylen)
{
    size_t bytes = n * PAGE;
    if (d->allowed_max != UINT64_MAX && d->reserved + bytes > d->allowed_max) {
        snprintf(why, whylen, "memory fraction limit of %llu bytes reached", (unsigned long long)d->allowed_max);
        return TALLY_ENOMEM;
    }
    int rc = tally__g.backend->map(d->id, (void *)(s->base + p * PAGE), bytes, hp * PAGE, why, whylen);
    if (rc)
        return rc;
    tally_expand_t *ex = s->ex;
    memset(ex->mapped + p, 1, n);
    for (size_t h = p; h < p + n; h += hp) {
        size_t k = p + n - h < hp ? p + n - h : hp;
        ex->hlen[h] = ex->hidle[h] = (uint32_t)k;
        for (size_t q = h; q < h + k; q++) {
            ex->hstart[q] = (uint32_t)h;
            idle_set(ex, q);
        }
        spare_handle(ex, h, true);
    }
    ex->idle += n;
    ex->nmapped += n;
    d->reserved += bytes;
    if (d->reserved - ahead * PAGE > high_water[d->id])
        high_water[d->id] = d->reserved - ahead * PAGE;
    d->stats.num_device_alloc++;
    tally__cache_reserved_rise_locked(d, TALLY_POOL_LARGE, (int64_t)bytes);
    return 0;
}

/* Map pages [p, p + n) (the last `ahead` mapped ahead of need) when pages
 * move rarely or never (expandable_move_budget >= 0). Pages never move (0,
 * the default): one handle per cell of expandable_handle_grid_mb that the
 * run crosses, cells counted from the region's base as PyTorch's 20 MiB
 * pages are, a piece shorter than a cell at either end going with its
 * neighbour (so a long run is handles of one to two cells, a run under two
 * cells one handle). A handle is unmapped only whole, once no live block
 * touches it: with a handle per map call a block later placed on part of a
 * freed 256 MiB run kept all of it mapped through empty_cache
 * (docs/benchmarks.md, run Z). One backend call per handle; a failure
 * unmaps the handles this call mapped. Within a finite budget a run is one
 * handle, as moves take whole handles: smaller ones let the moves of some
 * budgets raise peaks above PyTorch's (run Z). */
static int map_cells(tally_device_t *d, tally_segment_t *s, size_t p, size_t n, size_t ahead, char *why,
                     size_t whylen)
{
    size_t cell = TALLY_OPT(expandable_move_budget) == 0
                      ? (size_t)TALLY_OPT(expandable_handle_grid_mb) * ((size_t)1 << 20) / PAGE
                      : 0;
    /* Under two cells the run is one handle, and from two cells up a head
     * joined to its next cell (under two cells' pages) stays inside it. */
    if (cell < 1 || n < 2 * cell)
        return map_run(d, s, p, n, n, ahead, why, whylen);
    for (size_t done = 0; done < n;) {
        size_t k = (p + done) / cell * cell + cell - (p + done); /* to the next cell boundary */
        if (done == 0 && k < cell)
            k += cell; /* a short head joins the first whole cell */
        if (n - done - k < cell)
            k = n - done; /* a short tail joins the last */
        /* Pages mapped ahead are the call's last: those mapped so far. */
        size_t ahead_so_far = done + k > n - ahead ? done + k - (n - ahead) : 0;
        int rc = map_run(d, s, p + done, k, k, ahead_so_far, why, whylen);
        if (rc) {
            for (size_t q = p, h; q < p + done && !tally__expand_unmap_held_locked(d); q += h) {
                h = s->ex->hlen[q];
                tally__expand_unmap_run_locked(d, s, q, h);
            }
            return rc;
        }
        done += k;
    }
    return 0;
}

/* Whether unmapping is held back: a capture is under way on the device. */
bool tally__expand_unmap_held_locked(tally_device_t *d)
{
    return tally__capture_on_locked(d);
}

/* Unmap pages [p, p + n) in one backend call: whole spare handles only,
 * after the work queued on the segment's stream (the one stream whose blocks
 * the region holds; another stream's uses of a block held it back with
 * events until done), never after the whole device: an unrelated stream
 * (NCCL's) is not waited for. Returns false (nothing changed) when the
 * backend refused. */
bool tally__expand_unmap_run_locked(tally_device_t *d, tally_segment_t *s, size_t p, size_t n)
{
    size_t bytes = n * PAGE;
    tally_expand_t *ex = s->ex;
    const tally_backend_t *be = tally__g.backend;
    if (be->stream_sync && be->stream_sync(d->id, s->stream))
        return false; /* not known to be done: still mapped, still spare */
    if (be->unmap(d->id, (void *)(s->base + p * PAGE), bytes))
        return false; /* still mapped, still spare */
    d->stats.num_device_free++;
    for (size_t h = p; h < p + n;) {
        size_t k = ex->hlen[h] ? ex->hlen[h] : 1; /* h is a handle's first page */
        if (tally__expand_is_spare(ex, h))
            spare_handle(ex, h, false);
        ex->hlen[h] = ex->hidle[h] = 0;
        h += k;
    }
    for (size_t q = p; q < p + n; q++)
        idle_clear(ex, q);
    memset(ex->mapped + p, 0, n);
    ex->idle -= n; /* only idle pages are ever unmapped while mapped blocks live */
    ex->nmapped -= n;
    d->reserved -= bytes;
    tally__stat_pool_dec(d->stats.reserved_bytes, TALLY_POOL_LARGE, (int64_t)bytes);
    return true;
}

/* Requests under this size get a 20 MiB segment in PyTorch's default
 * placement; here they grow the range by expandable_grow_chunk_mb. When
 * pages go in large handles (expandable_move_budget not -1), blocks
 * under GROW_ONE_HANDLE do: fewer, larger handles, and on the recorded
 * traces the same peak (docs/benchmarks.md, run I: 10, 20, 40 and 64 MiB
 * measured; 64 raised resnet50's). */
#define GROW_SMALL ((size_t)10 << 20)
#define GROW_ONE_HANDLE ((size_t)40 << 20)

/* Pages to map past the block's last page in the same call, over free,
 * unmapped pages of the block after it: as many as fit under the
 * high-water mark (free: the peak does not move); and when the block is
 * under 10 MiB and grows the range (the free block after it is the
 * region's last), up to the next expandable_grow_chunk_mb boundary, so the
 * next small blocks find pages mapped: those are returned in *ahead, and
 * may raise reserved memory but not the mark (under 40 MiB when each map
 * call is one handle). run: the pages this call
 * maps for the block itself. */
static size_t map_ahead_pages(const tally_device_t *d, const tally_block_t *b, size_t last, size_t run,
                              size_t *ahead)
{
    const tally_segment_t *s = b->seg;
    const tally_block_t *rest = b->next;
    *ahead = 0;
    if (!rest || rest->state != BLOCK_FREE)
        return 0;
    uint64_t after = d->reserved + run * PAGE;
    size_t under_mark = high_water[d->id] > after ? (high_water[d->id] - after) / PAGE : 0;
    size_t want = under_mark;
    size_t chunk = (size_t)TALLY_OPT(expandable_grow_chunk_mb) * ((size_t)1 << 20) / PAGE;
    size_t grow_below = TALLY_OPT(expandable_move_budget) < 0 ? GROW_SMALL : GROW_ONE_HANDLE;
    if (chunk > 1 && b->size < grow_below && !rest->next)
        want += (last / chunk + 1) * chunk - last - 1; /* to the next chunk boundary */
    size_t end = (rest->addr + rest->size - s->base) / PAGE; /* pages wholly inside rest end here */
    size_t n = 0;
    while (n < want && last + 1 + n < end && !s->ex->mapped[last + 1 + n])
        n++;
    *ahead = n > under_mark ? n - under_mark : 0;
    return n;
}

/* Pages per physical handle for a run of n new pages of block b: the
 * whole run when b is at least expandable_handle_mb, else 1 (a handle per
 * page). */
static size_t handle_pages(const tally_block_t *b, size_t n)
{
    size_t min_mb = (size_t)TALLY_OPT(expandable_handle_mb);
    return min_mb && n > 1 && b->size >= min_mb << 20 ? n : 1;
}

/* need new pages are about to be mapped. Moving idle pages here keeps
 * reserved memory under the mark, at the price of driver calls (unmap
 * there, map here) that a repeating job would make every step; within
 * expandable_move_budget only. Otherwise (and during a capture) new pages:
 * past the mark, or OOM. Idle pages go in whole runs, the longest first
 * (pages [lo, hi] of keep stay), then free small-pool segments. ends_last:
 * a region's last idle run is taken after every other, and only as much of
 * it as is needed (tally__expand_steal_runs_locked). */
static void make_room(tally_device_t *d, size_t need, const tally_segment_t *keep, size_t lo, size_t hi,
                      bool ends_last)
{
    uint64_t room = high_water[d->id] > d->reserved ? (high_water[d->id] - d->reserved) / PAGE : 0;
    if (need > room && !tally__expand_unmap_held_locked(d))
        tally__expand_move_locked(d, need - room, keep, lo, hi, ends_last);
}

/* map_pages: tally__expand_map_locked's work, with the block's page span
 * and the count of its pages not yet mapped. */
static int map_pages(tally_device_t *d, tally_block_t *b, tally_segment_t *s, size_t first, size_t last, size_t need,
                     bool map_more, char *why, size_t whylen)
{
    tally_expand_t *ex = s->ex;
    make_room(d, need, s, first, last, false);
    for (size_t p = first; p <= last;) {
        if (ex->mapped[p]) {
            p++;
            continue;
        }
        size_t n = 1;
        while (p + n <= last && !ex->mapped[p + n])
            n++;
        size_t ahead = 0, more = 0;
        if (p + n > last && map_more)
            more = map_ahead_pages(d, b, last, n, &ahead);
        size_t hp = handle_pages(b, n);
        int rc;
        if (TALLY_OPT(expandable_move_budget) >= 0) {
            /* Pages move rarely or never: the run and the pages ahead of it
             * in large handles (map_cells); a move takes whole idle
             * handles. Without limit (-1), the handle policy below. */
            rc = map_cells(d, s, p, n + more, ahead, why, whylen);
        } else if (hp > 1) {
            /* The block's pages in large handles; pages mapped ahead in a
             * call of their own, a handle per page (a failure there only
             * leaves them unmapped). */
            rc = map_run(d, s, p, n, hp, 0, why, whylen);
            if (!rc && more) {
                char ignored[128];
                map_run(d, s, p + n, more, 1, ahead, ignored, sizeof ignored);
            }
        } else {
            rc = map_run(d, s, p, n + more, 1, ahead, why, whylen);
        }
        if (rc) {
            /* Undo this block's new pages: the spare handles on its pages
             * before p (no live block touches them). */
            for (size_t q = first; q < p && !tally__expand_unmap_held_locked(d);) {
                if (!tally__expand_is_spare(ex, q)) {
                    q++;
                    continue;
                }
                size_t h = ex->hstart[q], k = ex->hlen[h];
                tally__expand_unmap_run_locked(d, s, h, k);
                q = h + k;
            }
            return rc;
        }
        /* Newly mapped: idle until the loop below counts the block. */
        p += n + more;
    }
    for (size_t p = first; p <= last; p++)
        if (ex->live[p]++ == 0)
            page_live(ex, p);
    return 0;
}

/* Back the block's pages with memory and count it on them. Spare handles
 * elsewhere are unmapped first, as many pages as are needed. map_more:
 * also map pages past the block (map_ahead_pages); the retry after an OOM
 * maps the block's own pages only. Returns 0 or the backend's error; on
 * error nothing changed. */
int tally__expand_map_locked(tally_device_t *d, tally_block_t *b, bool map_more, char *why, size_t whylen)
{
    tally_segment_t *s = b->seg;
    tally_expand_t *ex = s->ex;
    size_t first, last, need = 0;
    page_span(s, b, &first, &last);
    for (size_t p = first; p <= last; p++)
        need += !ex->mapped[p];
    /* With moves unlimited (a handle per page), the pages a steal unmaps
     * for this block are mapped here again as they are: no release there
     * and no new handle here for each page moved (run W). */
    void (*keep)(int, bool) = TALLY_OPT(expandable_move_budget) < 0 ? tally__g.backend->keep_handles : NULL;
    if (keep)
        keep(d->id, true);
    int rc = map_pages(d, b, s, first, last, need, map_more, why, whylen);
    if (keep)
        keep(d->id, false);
    return rc;
}

/* A small-pool segment of bytes is about to be allocated beside the
 * regions (2 MiB segments: the small pool keeps them when moves are on):
 * with moves unlimited (-1), when it would take reserved memory past the
 * high-water mark, memory moves to pay for it, as for a large block's new
 * pages. Without it, a training job's backward, whose small blocks grow
 * while its large pool holds the forward's freed activations, adds every
 * small segment to the peak (the cold trace, run U of docs/benchmarks.md).
 * Not within a finite budget: there a job whose small blocks come back
 * every step moved the same memory both ways every step (the small segment
 * taking large pages, the large blocks then releasing it) for no lower
 * peak (ddp at 50 ms: 20 driver calls a step, none without). The
 * region's last idle pages go last, and only as many as needed: the large
 * pool maps them again when it grows, so taking them first cost opt125m
 * 13,829 driver calls where 2,930 do now, for the same peak (run V). */
void tally__expand_make_room_locked(tally_device_t *d, size_t bytes)
{
    if (TALLY_OPT(expandable_move_budget) < 0)
        make_room(d, (bytes + PAGE - 1) / PAGE, NULL, 0, 0, true);
}

/* Whether the first size bytes of free block b lie on mapped pages. */
bool tally__expand_mapped_locked(const tally_block_t *b, size_t size)
{
    const tally_segment_t *s = b->seg;
    size_t first = (b->addr - s->base) / PAGE, last = (b->addr - s->base + size - 1) / PAGE;
    for (size_t p = first; p <= last; p++)
        if (!s->ex->mapped[p])
            return false;
    return true;
}

/* The block no longer needs its pages (called before it merges). */
void tally__expand_unref_locked(tally_block_t *b)
{
    tally_segment_t *s = b->seg;
    size_t first, last;
    page_span(s, b, &first, &last);
    for (size_t p = first; p <= last; p++)
        if (--s->ex->live[p] == 0)
            page_idle(s->ex, p);
}

/* Unmap every idle page (empty_cache, stage-end release); none while a
 * capture is under way (the next release after it does). */
size_t tally__expand_trim_locked(tally_device_t *d)
{
    /* tally__cache_release_all_locked, its only caller, releases nothing
     * during a capture and never gets here then; this keeps any other
     * caller from unmapping under a capture. */
    if (tally__expand_unmap_held_locked(d))
        return 0;
    size_t bytes = tally__expand_unmap_idle_locked(d, SIZE_MAX, NULL, 0, 0) * PAGE;
    /* An explicit release also resets the mark idle pages are kept under. */
    high_water[d->id] = d->reserved;
    return bytes;
}

/* Give the whole region back (its only block is free): unmap, unreserve.
 * Returns the bytes of memory that were mapped. */
size_t tally__expand_release_locked(tally_device_t *d, tally_segment_t *s)
{
    tally_expand_t *ex = s->ex;
    size_t bytes = ex->nmapped * PAGE;
    for (size_t p = 0; p < ex->npages;) {
        if (!ex->mapped[p]) {
            p++;
            continue;
        }
        size_t n = 1;
        while (p + n < ex->npages && ex->mapped[p + n])
            n++;
        tally__expand_unmap_run_locked(d, s, p, n);
        p += n;
    }
    tally__g.backend->unreserve(d->id, (void *)s->base, s->size);
    tally__meta_free(ex->mapped);
    tally__meta_free(ex->live);
    tally__meta_free(ex->idle_bits);
    tally__meta_free(ex->spare_bits);
    tally__meta_free(ex->hstart);
    tally__meta_free(ex->hlen);
    tally__meta_free(ex->hidle);
    tally__meta_free(ex);
    s->ex = NULL;
    return bytes;
}

size_t tally__expand_mapped_bytes(const tally_segment_t *s)
{
    return s->ex->nmapped * PAGE;
}

/* Pages and counts against the blocks: every active block's pages mapped,
 * live counts equal a recount, idle equals mapped pages nobody touches,
 * handles tile the mapped pages and the spare ones are wholly idle. */
int tally__expand_check_locked(const tally_segment_t *s, char *why, size_t whylen)
{
    const tally_expand_t *ex = s->ex;
    uint32_t *live = tally__meta_calloc(ex->npages * sizeof *live);
    if (!live) {
        snprintf(why, whylen, "out of host memory for the page recount");
        return -1;
    }
    int rc = 0;
    for (const tally_block_t *b = s->head; b; b = b->next) {
        if (b->state == BLOCK_FREE)
            continue;
        size_t first, last;
        page_span(s, b, &first, &last);
        for (size_t p = first; p <= last; p++) {
            live[p]++;
            if (!ex->mapped[p] && !rc) {
                snprintf(why, whylen, "block %p uses unmapped page %zu", (void *)b->addr, p);
                rc = -1;
            }
        }
    }
    size_t mapped = 0, idle = 0;
    for (size_t p = 0; p < ex->npages && !rc; p++) {
        mapped += ex->mapped[p];
        idle += ex->mapped[p] && !live[p];
        bool bit = ex->idle_bits[p >> 6] >> (p & 63) & 1;
        if (bit != (ex->mapped[p] && !live[p]) && !rc) {
            snprintf(why, whylen, "page %zu of segment %p: idle bit %d is wrong", p, (void *)s->base, bit);
            rc = -1;
        }
        if (live[p] != ex->live[p]) {
            snprintf(why, whylen, "page %zu of segment %p counts %u live blocks, recount %u", p, (void *)s->base,
                     ex->live[p], live[p]);
            rc = -1;
        }
    }
    if (!rc && (mapped != ex->nmapped || idle != ex->idle)) {
        snprintf(why, whylen, "segment %p: %zu pages mapped (%zu counted), %zu idle (%zu counted)", (void *)s->base,
                 mapped, ex->nmapped, idle, ex->idle);
        rc = -1;
    }
    /* Handles: mapped pages tile into handles (first page, length, idle
     * pages); a page is spare exactly when its whole handle is idle. */
    size_t spare = 0;
    for (size_t h = 0; h < ex->npages && !rc;) {
        bool bit = tally__expand_is_spare(ex, h);
        if (!ex->mapped[h]) {
            if (bit || ex->hlen[h]) {
                snprintf(why, whylen, "unmapped page %zu of segment %p is %s", h, (void *)s->base,
                         bit ? "spare" : "the first page of a handle");
                rc = -1;
            }
            h++;
            continue;
        }
        size_t n = ex->hlen[h], idle_pages = 0;
        if (ex->hstart[h] != h || n == 0 || h + n > ex->npages) {
            snprintf(why, whylen, "page %zu of segment %p: handle at page %u of %zu pages where one should begin", h,
                     (void *)s->base, ex->hstart[h], n);
            rc = -1;
            break;
        }
        for (size_t q = h; q < h + n && !rc; q++) {
            if (!ex->mapped[q] || ex->hstart[q] != h || (q > h && ex->hlen[q]) ||
                tally__expand_is_spare(ex, q) != bit) {
                snprintf(why, whylen, "page %zu of segment %p is not part of its handle at page %zu (%zu pages)",
                         q, (void *)s->base, h, n);
                rc = -1;
            }
            idle_pages += !live[q];
        }
        if (!rc && (idle_pages != ex->hidle[h] || bit != (idle_pages == n))) {
            snprintf(why, whylen, "handle at page %zu of segment %p: %zu of %zu pages idle, %u counted, spare %d",
                     h, (void *)s->base, idle_pages, n, ex->hidle[h], bit);
            rc = -1;
        }
        spare += bit ? n : 0;
        h += n;
    }
    if (!rc && spare != ex->spare) {
        snprintf(why, whylen, "segment %p: %zu spare pages, %zu counted", (void *)s->base, spare, ex->spare);
        rc = -1;
    }
    tally__meta_free(live);
    return rc;
}
