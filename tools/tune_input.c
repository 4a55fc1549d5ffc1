/* tally tune's inputs as one trace (tune.h): a CSV trace (bench/trace.c
 * reads it), a PyTorch memory snapshot pickle (read with tools/pickle.c and
 * turned into events by the rules of docs/tune.md), or a tally JSON report
 * recorded with trace:true (read here, its alloc_trace turned into events
 * by tune_input_report.c). */
#include "tune.h"

#include "pickle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tune_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- PyTorch snapshot --------------------------------------------------------- */

typedef struct snap_ctx {
    const char *path;
    char *err;
    size_t errlen;
} snap_ctx_t;

/* An integer member of dict; -1 with a message naming where if absent. */
static int snap_int(const snap_ctx_t *c, const pk_value_t *dict, const char *key, const char *where, size_t i,
                    int64_t *out)
{
    const pk_value_t *v = pk_get(dict, key);
    if (!v)
        return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: %s[%zu]: '%s' is missing", c->path, where, i, key);
    if (v->type != PK_INT)
        return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: %s[%zu]: '%s' is a %s, not an integer", c->path,
                         where, i, key, pk_type_name(v));
    *out = v->i;
    return 0;
}

static const pk_value_t *snap_list(const snap_ctx_t *c, const pk_value_t *v, const char *what)
{
    if (!v || v->type != PK_LIST) {
        tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: '%s' is %s, not a list", c->path, what,
                  v ? pk_type_name(v) : "missing");
        return NULL;
    }
    return v;
}

/* Mark the free_requested events whose free_completed comes after other
 * allocations, frees or segment events (cross-stream frees). */
static int snap_defer(tune_snap_events_t *s)
{
    size_t n = s->ev->n, cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint64_t *keys = calloc(cap, sizeof *keys);
    size_t *req = calloc(cap, sizeof *req), *mark = calloc(cap, sizeof *mark);
    s->defer = calloc(n ? n : 1, 1);
    s->fire = calloc(n ? n : 1, 1);
    if (!keys || !req || !mark || !s->defer || !s->fire) {
        free(keys), free(req), free(mark);
        free(s->defer), free(s->fire);
        s->defer = s->fire = NULL;
        return -1;
    }
    size_t relevant = 0, deferred = 0;
    for (size_t i = 0; i < n; i++) {
        const pk_value_t *e = s->ev->items[i], *a = pk_get(e, "action"), *addr = pk_get(e, "addr");
        bool done = pk_str_is(a, "free_completed");
        if (!done && !pk_str_is(a, "alloc") && !pk_str_is(a, "free_requested") && !pk_str_is(a, "segment_alloc") &&
            !pk_str_is(a, "segment_free") && !pk_str_is(a, "segment_map") && !pk_str_is(a, "segment_unmap"))
            continue;
        if (!done)
            relevant++;
        if (!addr || addr->type != PK_INT || (!done && !pk_str_is(a, "free_requested")))
            continue;
        /* The slot of this address: keys hold addr + 1 (0: empty). */
        uint64_t k = (uint64_t)addr->i + 1;
        size_t h = (size_t)((k * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
        while (keys[h] && keys[h] != k)
            h = (h + 1) & (cap - 1);
        if (!done) {
            keys[h] = k;
            req[h] = i + 1;
            mark[h] = relevant;
        } else if (keys[h] && req[h]) {
            if (mark[h] != relevant) {
                s->defer[req[h] - 1] = 1;
                s->fire[i] = 1;
                deferred++;
            }
            req[h] = 0;
        }
    }
    free(keys), free(req), free(mark);
    if (!deferred) {
        free(s->defer), free(s->fire);
        s->defer = s->fire = NULL;
    }
    return 0;
}

int tune_add_prelive(tune_snap_events_t *s, uint64_t addr, uint64_t size, uint64_t stream)
{
    if (s->npre == s->cappre) {
        size_t cap = s->cappre ? s->cappre * 2 : 256;
        tune_prelive_t *g = realloc(s->pre, cap * sizeof *g);
        if (!g)
            return -1;
        s->pre = g;
        s->cappre = cap;
    }
    s->pre[s->npre++] = (tune_prelive_t){addr, size, stream, 0};
    return 0;
}

/* Feed the device's alloc / free_requested events to b. With pre != NULL
 * (first pass) a free of an address not live is an allocation made before
 * recording: noted in pre, not fed. Segment events update the recorded
 * reserved memory when rec is given. */
static int snap_feed(const snap_ctx_t *c, tune_snap_events_t *s, trace_builder_t *b, bool first, tune_input_t *rec)
{
    char why[400];
    int64_t reserved = rec ? rec->recorded_start : 0;
    for (size_t i = 0; i < s->ev->n; i++) {
        const pk_value_t *e = s->ev->items[i];
        const pk_value_t *action = pk_get(e, "action");
        if (!action)
            return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: device_traces event[%zu]: 'action' is missing",
                             c->path, i);
        if (action->type != PK_STR) {
            const char *t = pk_type_name(action);
            return tune_fail(c->err, c->errlen,
                             "%s: PyTorch snapshot: device_traces event[%zu]: 'action' is %s %s, not a string", c->path,
                             i, strchr("aeiou", t[0]) ? "an" : "a", t);
        }
        bool alloc = pk_str_is(action, "alloc"), free_req = pk_str_is(action, "free_requested");
        bool fire = s->fire && s->fire[i];
        if (s->defer && s->defer[i] && !first)
            continue; /* freed at its free_completed */
        free_req = free_req || fire;
        bool seg_up = pk_str_is(action, "segment_alloc") || pk_str_is(action, "segment_map");
        bool seg_down = pk_str_is(action, "segment_free") || pk_str_is(action, "segment_unmap");
        if (!alloc && !free_req && !seg_up && !seg_down)
            continue; /* free_completed, snapshot, oom: not the user's allocations */
        int64_t addr, size, stream = 0;
        if (snap_int(c, e, "addr", "device_traces event", i, &addr) ||
            snap_int(c, e, "size", "device_traces event", i, &size))
            return -1;
        if (pk_get(e, "stream") && snap_int(c, e, "stream", "device_traces event", i, &stream))
            return -1;
        if (size < 0 || stream < 0)
            return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: device_traces event %zu: negative size or stream",
                             c->path, i);
        if (seg_up || seg_down) {
            if (rec) {
                if (__builtin_add_overflow(reserved, seg_up ? size : -size, &reserved))
                    return tune_fail(c->err, c->errlen,
                                     "%s: PyTorch snapshot: device_traces event %zu: the reserved bytes go past 2^63 - 1",
                                     c->path, i);
                if (reserved > rec->recorded_peak)
                    rec->recorded_peak = reserved;
                rec->recorded_segment_allocs += pk_str_is(action, "segment_alloc");
                /* The program gave cached memory back here (empty_cache, an OOM retry): a run of segment
                 * frees or unmaps is one release, replayed at the same point. */
                if (seg_down && (b->t->nev == 0 || b->t->ev[b->t->nev - 1].op != 'e')) {
                    if (trace_add(b, 'e', 0, 0, 0, why, sizeof why))
                        return tune_fail(c->err, c->errlen, "%s: %s", c->path, why);
                    rec->releases++;
                }
            }
            continue;
        }
        if (first && fire && !trace_is_live(b, (uint64_t)addr))
            continue; /* allocated before recording: noted at its free_requested */
        if (first && free_req && !trace_is_live(b, (uint64_t)addr)) {
            if (tune_add_prelive(s, (uint64_t)addr, (uint64_t)size, (uint64_t)stream))
                return tune_fail(c->err, c->errlen, "%s: out of memory", c->path);
            continue;
        }
        if (first && s->defer && s->defer[i])
            continue; /* a live block freed later, at its free_completed */
        if (trace_add(b, alloc ? 'a' : 'f', (uint64_t)addr, free_req ? 0 : (uint64_t)size, (uint64_t)stream, why,
                      sizeof why))
            return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: device_traces event %zu (%.*s at address %lld): %s",
                             c->path, i, (int)action->len, action->s, (long long)addr, why);
    }
    return 0;
}

/* The device's segments: their total size, and (first pass) the blocks
 * active at dump time that no traced allocation explains. */
static int snap_segments(const snap_ctx_t *c, const pk_value_t *segs, int device, tune_snap_events_t *s,
                         const trace_builder_t *b, int64_t *total)
{
    *total = 0;
    for (size_t i = 0; i < segs->n; i++) {
        const pk_value_t *seg = segs->items[i];
        int64_t dev = 0, size, stream = 0;
        if (pk_get(seg, "device") && snap_int(c, seg, "device", "segments", i, &dev))
            return -1;
        if (dev != device)
            continue;
        if (snap_int(c, seg, "total_size", "segments", i, &size))
            return -1;
        if (pk_get(seg, "stream") && snap_int(c, seg, "stream", "segments", i, &stream))
            return -1;
        if (size < 0)
            return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: segments[%zu]: 'total_size' is negative", c->path,
                             i);
        if (__builtin_add_overflow(*total, size, total))
            return tune_fail(c->err, c->errlen,
                             "%s: PyTorch snapshot: segments[%zu]: device %d's segments add up past 2^63 - 1 bytes",
                             c->path, i, device);
        const pk_value_t *blocks = snap_list(c, pk_get(seg, "blocks"), "segments[].blocks");
        if (!blocks)
            return -1;
        for (size_t k = 0; k < blocks->n; k++) {
            const pk_value_t *blk = blocks->items[k];
            if (!pk_str_is(pk_get(blk, "state"), "active_allocated"))
                continue;
            int64_t addr, req, bsize = 0;
            if (snap_int(c, blk, "address", "segments[].blocks", k, &addr) ||
                snap_int(c, blk, "requested_size", "segments[].blocks", k, &req))
                return -1;
            if (pk_get(blk, "size") && snap_int(c, blk, "size", "segments[].blocks", k, &bsize))
                return -1;
            if (pk_get(blk, "size") && bsize < req) /* a block holds at least what was asked */
                return tune_fail(c->err, c->errlen,
                                 "%s: PyTorch snapshot: segments[].blocks[%zu]: 'size' %lld is smaller than its "
                                 "'requested_size' %lld",
                                 c->path, k, (long long)bsize, (long long)req);
            if (!trace_is_live(b, (uint64_t)addr)) {
                if (tune_add_prelive(s, (uint64_t)addr, (uint64_t)req, (uint64_t)stream))
                    return tune_fail(c->err, c->errlen, "%s: out of memory", c->path);
                s->pre[s->npre - 1].block = bsize > 0 ? (uint64_t)bsize : 0;
            }
        }
    }
    return 0;
}

/* Reserved memory the window's segment events added, net, in *net; -1 if
 * it does not fit in an int64_t. */
static int snap_segment_net(const pk_value_t *ev, int64_t *out)
{
    int64_t net = 0;
    for (size_t i = 0; i < ev->n; i++) {
        const pk_value_t *a = pk_get(ev->items[i], "action");
        const pk_value_t *sz = pk_get(ev->items[i], "size");
        if (!sz || sz->type != PK_INT)
            continue;
        bool over = false;
        if (pk_str_is(a, "segment_alloc") || pk_str_is(a, "segment_map"))
            over = __builtin_add_overflow(net, sz->i, &net);
        else if (pk_str_is(a, "segment_free") || pk_str_is(a, "segment_unmap"))
            over = __builtin_sub_overflow(net, sz->i, &net);
        if (over)
            return -1;
    }
    *out = net;
    return 0;
}

/* The device with the most traced events. */
static int snap_device(const pk_value_t *traces)
{
    int best = 0;
    size_t most = 0;
    for (size_t i = 0; i < traces->n; i++)
        if (traces->items[i]->type == PK_LIST && traces->items[i]->n > most) {
            most = traces->items[i]->n;
            best = (int)i;
        }
    return best;
}

/* ---- the recorded state: what was reserved when recording began ---------------- */

typedef struct range_list {
    ptx_range_t *r;
    size_t n, cap;
} range_list_t;

static int range_add(range_list_t *l, ptx_range_t r)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        ptx_range_t *g = realloc(l->r, cap * sizeof *g);
        if (!g)
            return -1;
        l->r = g;
        l->cap = cap;
    }
    l->r[l->n++] = r;
    return 0;
}

/* Take [addr, addr + size) out of every range of l (an expandable
 * recording's pages mapped inside the window were not mapped before it). */
static int range_cut(range_list_t *l, uint64_t addr, uint64_t size)
{
    for (size_t i = 0; i < l->n; i++) {
        ptx_range_t *r = &l->r[i];
        uint64_t lo = addr > r->addr ? addr : r->addr;
        uint64_t hi = addr + size < r->addr + r->size ? addr + size : r->addr + r->size;
        if (lo >= hi)
            continue;
        ptx_range_t tail = *r;
        tail.addr = hi;
        tail.size = r->addr + r->size - hi;
        r->size = lo - r->addr;
        if (tail.size && range_add(l, tail))
            return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->r[i].size)
            l->r[k++] = l->r[i];
    l->n = k;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const ptx_range_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The segments (for an expandable recording, the mapped ranges) that
 * existed when recording began, and the blocks live in them: the dump's
 * segments, less those the window allocated (or mapped), plus those it
 * freed (or unmapped); every block live then is one of the allocations
 * placed first (rule 3), at its address; all else in them was free. */
static int snap_start(const snap_ctx_t *c, const pk_value_t *segs, int device, const tune_snap_events_t *s,
                      tune_input_t *in)
{
    tune_start_t *st = &in->start;
    range_list_t l = {0};
    bool expandable = strstr(in->recorded_conf, "expandable_segments:True") != NULL;
    for (size_t i = 0; i < segs->n; i++) {
        const pk_value_t *seg = segs->items[i], *ex = pk_get(seg, "is_expandable");
        int64_t dev = 0;
        if (pk_get(seg, "device") && snap_int(c, seg, "device", "segments", i, &dev))
            return -1;
        if (dev == device && ex && ex->type == PK_BOOL && ex->i)
            expandable = true;
    }
    st->expandable = expandable;
    /* The window's segment events, newest first, undo what they did. */
    size_t mapped_in_window = 0;
    for (size_t i = 0; i < segs->n; i++) {
        const pk_value_t *seg = segs->items[i];
        int64_t dev = 0, addr, size, stream = 0;
        /* The ranges gathered so far are freed on a bad field (fuzz_tune_input). */
        if ((pk_get(seg, "device") && snap_int(c, seg, "device", "segments", i, &dev)) ||
            (dev == device && (snap_int(c, seg, "address", "segments", i, &addr) ||
                               snap_int(c, seg, "total_size", "segments", i, &size) ||
                               (pk_get(seg, "stream") && snap_int(c, seg, "stream", "segments", i, &stream))))) {
            free(l.r);
            return -1;
        }
        if (dev != device)
            continue;
        ptx_range_t r = {(uint64_t)addr, (uint64_t)size, (uint64_t)stream,
                         pk_str_is(pk_get(seg, "segment_type"), "small")};
        if (range_add(&l, r))
            goto nomem;
    }
    for (size_t i = s->ev->n; i-- > 0;) {
        const pk_value_t *e = s->ev->items[i], *a = pk_get(e, "action");
        const pk_value_t *av = pk_get(e, "addr"), *sv = pk_get(e, "size"), *tv = pk_get(e, "stream");
        bool up = pk_str_is(a, "segment_alloc") || pk_str_is(a, "segment_map");
        bool down = pk_str_is(a, "segment_free") || pk_str_is(a, "segment_unmap");
        if ((!up && !down) || !av || av->type != PK_INT || !sv || sv->type != PK_INT)
            continue;
        if (up) {
            mapped_in_window++;
            if (range_cut(&l, (uint64_t)av->i, (uint64_t)sv->i))
                goto nomem;
        } else {
            ptx_range_t r = {(uint64_t)av->i, (uint64_t)sv->i, tv && tv->type == PK_INT ? (uint64_t)tv->i : 0,
                             (uint64_t)sv->i <= ((uint64_t)2 << 20)};
            if (range_add(&l, r))
                goto nomem;
        }
    }
    if (l.n) /* l.r is NULL when no range was recorded */
        qsort(l.r, l.n, sizeof *l.r, cmp_range);
    st->ranges = l.r;
    st->nranges = l.n;
    st->live = calloc(s->npre ? s->npre : 1, sizeof *st->live);
    if (!st->live)
        goto nomem;
    size_t outside = 0;
    for (size_t i = 0; i < s->npre; i++) {
        const tune_prelive_t *p = &s->pre[i];
        uint64_t size = p->block ? p->block : p->size < 512 ? 512 : (p->size + 511) / 512 * 512;
        bool in_range = false;
        for (size_t k = 0; k < l.n && !in_range; k++)
            in_range = p->addr >= l.r[k].addr && p->addr + size <= l.r[k].addr + l.r[k].size;
        outside += !in_range;
        st->live[i] = (ptx_live_t){p->addr, size, (uint32_t)i};
    }
    st->nlive = s->npre;
    st->known = outside == 0;
    if (outside)
        snprintf(st->gap, sizeof st->gap,
                 "%zu block%s live before recording lie%s outside the segments it had then; the replay starts from "
                 "an empty cache", outside, outside == 1 ? "" : "s", outside == 1 ? "s" : "");
    else if (expandable && mapped_in_window)
        snprintf(st->gap, sizeof st->gap,
                 "the pages mapped at the start are the dump's less the %zu map event%s of the window", mapped_in_window,
                 mapped_in_window == 1 ? "" : "s");
    return 0;
nomem:
    free(l.r);
    st->ranges = NULL;
    st->nranges = 0;
    return tune_fail(c->err, c->errlen, "%s: out of memory", c->path);
}

static int snapshot_convert(const snap_ctx_t *c, const pk_value_t *root, int device, tune_input_t *in)
{
    if (!root || root->type != PK_DICT)
        return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: the pickle holds a %s, not a dict", c->path,
                         pk_type_name(root));
    const pk_value_t *segs = snap_list(c, pk_get(root, "segments"), "segments");
    const pk_value_t *traces = segs ? snap_list(c, pk_get(root, "device_traces"), "device_traces") : NULL;
    if (!traces)
        return -1;
    if (device >= 0 && (size_t)device >= traces->n)
        return tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: no device %d (device_traces has %zu device%s)",
                         c->path, device, traces->n, traces->n == 1 ? "" : "s");
    in->device = device >= 0 ? device : snap_device(traces);
    tune_snap_events_t s = {0};
    s.ev = traces->n ? snap_list(c, traces->items[in->device], "device_traces[]") : NULL;
    if (!s.ev)
        return traces->n ? -1 : tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: 'device_traces' is empty", c->path);
    const pk_value_t *settings = pk_get(root, "allocator_settings");
    const pk_value_t *conf = pk_get(settings, "PYTORCH_CUDA_ALLOC_CONF");
    if (conf && conf->type == PK_STR)
        snprintf(in->recorded_conf, sizeof in->recorded_conf, "%.*s", (int)conf->len, conf->s);

    /* Pass 1: which allocations were live before recording began. */
    trace_t scratch;
    trace_builder_t b;
    int64_t total = 0;
    if (snap_defer(&s))
        return tune_fail(c->err, c->errlen, "%s: out of memory", c->path);
    int rc = trace_begin(&b, &scratch, c->path, c->err, c->errlen);
    if (!rc)
        rc = snap_feed(c, &s, &b, true, NULL);
    if (!rc)
        rc = snap_segments(c, segs, in->device, &s, &b, &total);
    trace_end(&b);
    trace_free(&scratch);

    /* Pass 2: those first, then the window. Reserved at the start: the
     * segments at dump time less what the window allocated, plus what it freed. */
    if (!rc) {
        int64_t net;
        if (snap_segment_net(s.ev, &net) || __builtin_sub_overflow(total, net, &in->recorded_start))
            rc = tune_fail(c->err, c->errlen,
                           "%s: PyTorch snapshot: the segment events' sizes add up past 2^63 - 1 bytes", c->path);
        in->recorded_peak = in->recorded_start;
        if (!rc)
            rc = trace_begin(&b, &in->trace, c->path, c->err, c->errlen);
        char why[400];
        for (size_t i = 0; !rc && i < s.npre; i++) {
            bool shared = trace_is_live(&b, s.pre[i].addr);
            if (trace_add(&b, 'a', s.pre[i].addr, s.pre[i].size, s.pre[i].stream, why, sizeof why))
                rc = shared ? tune_fail(c->err, c->errlen,
                                        "%s: PyTorch snapshot: two allocations live before recording began share address "
                                        "%llu (freed twice with no allocation between, or freed and still active at "
                                        "dump): %s",
                                        c->path, (unsigned long long)s.pre[i].addr, why)
                            : tune_fail(c->err, c->errlen, "%s: PyTorch snapshot: the blocks live before recording began: %s",
                                        c->path, why);
        }
        if (!rc)
            rc = snap_feed(c, &s, &b, false, in);
        trace_end(&b);
        in->has_recorded = !rc;
        if (!rc)
            rc = snap_start(c, segs, in->device, &s, in);
    }
    in->prelive = s.npre;
    free(s.pre);
    free(s.defer);
    free(s.fire);
    return rc;
}

int tune_snapshot_parse(unsigned char *data, size_t len, const char *name, tune_input_t *in, char *err,
                        size_t errlen)
{
    memset(in, 0, sizeof *in);
    in->kind = "PyTorch snapshot";
    pk_doc_t doc;
    if (pk_parse(data, len, &doc, name, err, errlen))
        return -1;
    snap_ctx_t c = {name, err, errlen};
    int rc = snapshot_convert(&c, doc.root, -1, in);
    pk_free(&doc);
    return rc;
}

/* ---- tally report with trace:true ----------------------------------------------- */

static char *report_text(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g) {
                free(buf);
                buf = NULL;
            }
            buf = g;
        }
    }
    fclose(f);
    if (!buf)
        snprintf(err, errlen, "%s: out of memory", path);
    *len = n;
    return buf;
}

int tune_report_load(const char *path, int device, tune_input_t *in, char *err, size_t errlen)
{
    size_t len;
    char *text = report_text(path, &len, err, errlen);
    if (!text)
        return -1;
    int rc = tune_report_parse(text, len, path, device, in, err, errlen);
    free(text);
    return rc;
}

/* ---- any input ------------------------------------------------------------------ */

int tune_input_load(const char *path, int device, tune_input_t *in, char *err, size_t errlen)
{
    memset(in, 0, sizeof *in);
    FILE *f = fopen(path, "rb");
    if (!f)
        return tune_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    int first = fgetc(f);
    while (first == ' ' || first == '\n' || first == '\r' || first == '\t')
        first = fgetc(f);
    fclose(f);
    int rc;
    if (first == 0x80) {
        in->kind = "PyTorch snapshot";
        pk_doc_t doc;
        rc = pk_load(path, &doc, err, errlen);
        if (!rc) {
            snap_ctx_t c = {path, err, errlen};
            rc = snapshot_convert(&c, doc.root, device, in);
            pk_free(&doc);
        }
    } else if (first == '{') {
        in->kind = "tally report";
        rc = tune_report_load(path, device, in, err, errlen);
    } else {
        in->kind = "CSV trace";
        rc = trace_load(path, &in->trace, err, errlen);
    }
    if (!rc && in->trace.nalloc == 0)
        rc = tune_fail(err, errlen, "%s: empty trace: no allocations to replay", path);
    if (rc)
        tune_input_free(in);
    return rc;
}

void tune_input_free(tune_input_t *in)
{
    trace_free(&in->trace);
    free(in->start.ranges);
    free(in->start.live);
    in->start.ranges = NULL;
    in->start.live = NULL;
}
