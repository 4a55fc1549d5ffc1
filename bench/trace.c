/* Trace files: strict CSV reading with errors that name file and line, and
 * the id -> dense slot mapping (see trace.h). */
#include "trace.h"

#include <tally.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Live ids: open addressing, id -> (slot, size). */
typedef struct live_map {
    uint64_t *ids;
    uint32_t *slots; /* UINT32_MAX: empty */
    uint64_t *sizes;
    size_t mask, count;
} live_map_t;

static size_t id_hash(uint64_t id, size_t mask)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

static int map_init(live_map_t *m, size_t cap)
{
    m->ids = malloc(cap * sizeof *m->ids);
    m->slots = malloc(cap * sizeof *m->slots);
    m->sizes = malloc(cap * sizeof *m->sizes);
    if (!m->ids || !m->slots || !m->sizes)
        return -1;
    memset(m->slots, 0xff, cap * sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
    return 0;
}

static void map_free(live_map_t *m)
{
    free(m->ids);
    free(m->slots);
    free(m->sizes);
}

static size_t map_find(const live_map_t *m, uint64_t id)
{
    size_t i = id_hash(id, m->mask);
    while (m->slots[i] != UINT32_MAX && m->ids[i] != id)
        i = (i + 1) & m->mask;
    return i;
}

static int map_put(live_map_t *m, uint64_t id, uint32_t slot, uint64_t size)
{
    if ((m->count + 1) * 2 > m->mask + 1) {
        live_map_t big;
        if (map_init(&big, (m->mask + 1) * 2))
            return -1;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->slots[i] != UINT32_MAX) {
                size_t j = map_find(&big, m->ids[i]);
                big.ids[j] = m->ids[i];
                big.slots[j] = m->slots[i];
                big.sizes[j] = m->sizes[i];
                big.count++;
            }
        map_free(m);
        *m = big;
    }
    size_t i = map_find(m, id);
    m->ids[i] = id;
    m->slots[i] = slot;
    m->sizes[i] = size;
    m->count++;
    return 0;
}

/* Remove entry i with backward-shift deletion. */
static void map_erase(live_map_t *m, size_t i)
{
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->slots[j] != UINT32_MAX; j = (j + 1) & m->mask) {
        size_t home = id_hash(m->ids[j], m->mask);
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->ids[hole] = m->ids[j];
            m->slots[hole] = m->slots[j];
            m->sizes[hole] = m->sizes[j];
            hole = j;
        }
    }
    m->slots[hole] = UINT32_MAX;
    m->count--;
}

/* A decimal field of [s, e): digits only, no sign, fits in 64 bits. */
static bool parse_u64(const char *s, const char *e, uint64_t *out)
{
    if (s == e || e - s > 20)
        return false;
    uint64_t v = 0;
    for (const char *p = s; p < e; p++) {
        if (*p < '0' || *p > '9')
            return false;
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int trace_begin(trace_builder_t *b, trace_t *t, const char *path, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->name = base_name(t->path);
    b->t = t;
    b->cap = 0;
    b->live_bytes = 0;
    b->live = malloc(sizeof(live_map_t));
    if (!b->live || map_init(b->live, 1024)) {
        free(b->live);
        b->live = NULL;
        return fail(err, errlen, "%s: out of memory", path);
    }
    return 0;
}

void trace_end(trace_builder_t *b)
{
    if (b->live) {
        map_free(b->live);
        free(b->live);
        b->live = NULL;
    }
}

int trace_is_live(const trace_builder_t *b, uint64_t id)
{
    const live_map_t *live = b->live;
    return live->slots[map_find(live, id)] != UINT32_MAX;
}

/* Room for one more event in b's trace. */
static int grow_events(trace_builder_t *b, char *err, size_t errlen)
{
    trace_t *t = b->t;
    if (t->nev < b->cap)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 4096;
    trace_event_t *grown = realloc(t->ev, cap * sizeof *grown);
    if (!grown)
        return fail(err, errlen, "out of memory");
    t->ev = grown;
    b->cap = cap;
    return 0;
}

int trace_add(trace_builder_t *b, char op, uint64_t id, uint64_t size, uint64_t stream, char *err, size_t errlen)
{
    trace_t *t = b->t;
    live_map_t *live = b->live;
    if (op == 'e') {
        /* A release of cached memory (tally tune: a snapshot's segment_free). */
        if (grow_events(b, err, errlen))
            return -1;
        t->ev[t->nev++] = (trace_event_t){0, UINT32_MAX, 0, 'e'};
        return 0;
    }
    size_t si = 0;
    while (si < t->nstreams && t->stream_ids[si] != (long long)stream)
        si++;
    if (si == t->nstreams) {
        if (t->nstreams == sizeof t->stream_ids / sizeof t->stream_ids[0])
            return fail(err, errlen, "more than %zu distinct streams", sizeof t->stream_ids / sizeof t->stream_ids[0]);
        t->stream_ids[t->nstreams++] = (long long)stream;
    }
    if (grow_events(b, err, errlen))
        return -1;
    trace_event_t *e = &t->ev[t->nev];
    e->op = op;
    e->stream = (uint16_t)si;
    size_t at = map_find(live, id);
    bool is_live = live->slots[at] != UINT32_MAX;
    if (op == 'a') {
        if (is_live)
            return fail(err, errlen, "allocation of id %llu, which is already live", (unsigned long long)id);
        if (t->nalloc >= UINT32_MAX - 1)
            return fail(err, errlen, "too many allocations");
        if (size > (uint64_t)INT64_MAX - b->live_bytes)
            return fail(err, errlen,
                        "allocation of id %llu (%llu bytes) takes the live bytes past 2^63 - 1 (%llu live before it)",
                        (unsigned long long)id, (unsigned long long)size, (unsigned long long)b->live_bytes);
        e->slot = (uint32_t)t->nalloc++;
        e->size = size;
        if (map_put(live, id, e->slot, size))
            return fail(err, errlen, "out of memory");
        b->live_bytes += size;
    } else {
        if (!is_live)
            return fail(err, errlen, "free of id %llu, which is not live (never allocated, or freed twice)",
                        (unsigned long long)id);
        if (size != 0 && size != live->sizes[at])
            return fail(err, errlen, "free of id %llu with size %llu, but it was allocated with %llu",
                        (unsigned long long)id, (unsigned long long)size, (unsigned long long)live->sizes[at]);
        e->slot = live->slots[at];
        e->size = live->sizes[at];
        b->live_bytes -= e->size;
        map_erase(live, at);
        t->nfree++;
    }
    t->nev++;
    return 0;
}

int trace_load(const char *path, trace_t *t, char *err, size_t errlen)
{
    trace_builder_t b;
    if (trace_begin(&b, t, path, err, errlen))
        return -1;
    FILE *f = fopen(path, "r");
    if (!f) {
        trace_end(&b);
        return fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    char why[512];
    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (lineno == 1) {
            if (strcmp(line, "op,id,size,stream") != 0) {
                rc = fail(err, errlen, "%s:1: header is '%.60s', expected 'op,id,size,stream'", path, line);
                break;
            }
            continue;
        }
        if (len == 0)
            continue; /* blank line (e.g. at the end) */
        if ((size_t)len != strlen(line)) {
            rc = fail(err, errlen, "%s:%ld: NUL byte in line", path, lineno);
            break;
        }
        const char *field[4], *end[4];
        int nf = 0;
        const char *p = line;
        for (;;) {
            if (nf == 4) {
                nf++;
                break;
            }
            field[nf] = p;
            const char *c = strchr(p, ',');
            end[nf] = c ? c : line + len;
            nf++;
            if (!c)
                break;
            p = c + 1;
        }
        if (nf != 4) {
            rc = fail(err, errlen, "%s:%ld: expected 4 fields op,id,size,stream, got %s in '%.80s'", path, lineno,
                      nf > 4 ? "more" : "fewer", line);
            break;
        }
        uint64_t id, size, stream;
        if (end[0] - field[0] != 1 || (field[0][0] != 'a' && field[0][0] != 'f')) {
            rc = fail(err, errlen, "%s:%ld: op '%.*s' is not 'a' or 'f'", path, lineno, (int)(end[0] - field[0]),
                      field[0]);
            break;
        }
        if (!parse_u64(field[1], end[1], &id)) {
            rc = fail(err, errlen, "%s:%ld: id '%.*s' is not an unsigned integer", path, lineno,
                      (int)(end[1] - field[1]), field[1]);
            break;
        }
        if (!parse_u64(field[2], end[2], &size) || size > (UINT64_MAX >> 2)) {
            rc = fail(err, errlen, "%s:%ld: size '%.*s' is not an unsigned integer of sane magnitude", path, lineno,
                      (int)(end[2] - field[2]), field[2]);
            break;
        }
        if (!parse_u64(field[3], end[3], &stream) || stream > 1000000000ull) {
            rc = fail(err, errlen, "%s:%ld: stream '%.*s' is not an unsigned integer", path, lineno,
                      (int)(end[3] - field[3]), field[3]);
            break;
        }
        if (trace_add(&b, field[0][0], id, size, stream, why, sizeof why)) {
            rc = fail(err, errlen, "%s:%ld: %s", path, lineno, why);
            break;
        }
    }
    if (!rc && ferror(f))
        rc = fail(err, errlen, "%s: read error: %s", path, strerror(errno));
    if (!rc && lineno == 0)
        rc = fail(err, errlen, "%s:1: empty file (no header)", path);
    free(line);
    fclose(f);
    trace_end(&b);
    if (rc)
        trace_free(t);
    return rc;
}

void trace_free(trace_t *t)
{
    free(t->ev);
    t->ev = NULL;
    t->nev = 0;
}

tally_host_calls_t trace_calls_since(const tally_host_calls_t *before, const tally_host_calls_t *after)
{
    const tally_host_calls_t *a = before, *b = after;
    return (tally_host_calls_t){.alloc = b->alloc - a->alloc,
                                .free = b->free - a->free,
                                .reserve = b->reserve - a->reserve,
                                .unreserve = b->unreserve - a->unreserve,
                                .map = b->map - a->map,
                                .map_pages = b->map_pages - a->map_pages,
                                .unmap = b->unmap - a->unmap,
                                .unmap_pages = b->unmap_pages - a->unmap_pages,
                                .unmap_runs = b->unmap_runs - a->unmap_runs,
                                .map_handles = b->map_handles - a->map_handles,
                                .unmap_handles = b->unmap_handles - a->unmap_handles,
                                .reused_handles = b->reused_handles - a->reused_handles};
}

void *trace_cuda_stream(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*dev_get)(int *, int) = NULL, (*retain)(void **, int) = NULL, (*ctx_push)(void *) = NULL,
        (*ctx_pop)(void **) = NULL, (*create)(void **, unsigned) = NULL;
    if (h) {
        *(void **)&dev_get = dlsym(h, "cuDeviceGet");
        *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
        *(void **)&ctx_push = dlsym(h, "cuCtxPushCurrent_v2");
        *(void **)&ctx_pop = dlsym(h, "cuCtxPopCurrent_v2");
        *(void **)&create = dlsym(h, "cuStreamCreate");
    }
    int dev;
    void *ctx, *popped, *stream = NULL;
    if (!dev_get || !retain || !ctx_push || !ctx_pop || !create || dev_get(&dev, 0) || retain(&ctx, dev) ||
        ctx_push(ctx))
        return NULL;
    if (create(&stream, 1 /* CU_STREAM_NON_BLOCKING */))
        stream = NULL;
    ctx_pop(&popped);
    return stream;
}

long trace_run(const trace_t *t, void **ptrs, void (*after)(void *arg, size_t i), void *arg)
{
    static void *made[sizeof t->stream_ids / sizeof t->stream_ids[0]];
    void *streams[sizeof t->stream_ids / sizeof t->stream_ids[0]];
    bool cuda = strstr(tally_backend_name(), "cuda") != NULL;
    for (size_t s = 0; s < t->nstreams; s++) {
        streams[s] = t->stream_ids[s] == 0 ? NULL : (void *)(uintptr_t)(0x100000u + 0x100u * (unsigned)s);
        if (streams[s] && cuda && (made[s] || (made[s] = trace_cuda_stream())))
            streams[s] = made[s];
    }
    long oom = -1;
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event_t *e = &t->ev[i];
        if (e->op == 'a') {
            if (e->size) {
                void *p = tally_malloc(e->size, 0, streams[e->stream]);
                if (!p && oom < 0)
                    oom = (long)i;
                ptrs[e->slot] = p;
            }
        } else if (e->op == 'e') {
            tally_empty_cache(0);
        } else {
            tally_free(ptrs[e->slot]);
            ptrs[e->slot] = NULL;
        }
        if (after)
            after(arg, i);
    }
    return oom;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int trace_dir_list(const char *dir, char ***paths, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return fail(err, errlen, "%s: cannot open directory: %s", dir, strerror(errno));
    char **list = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".csv") != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **grown = realloc(list, (size_t)cap * sizeof *grown);
            if (!grown)
                break;
            list = grown;
        }
        size_t pl = strlen(dir) + l + 2;
        list[n] = malloc(pl);
        if (!list[n])
            break;
        snprintf(list[n], pl, "%s/%s", dir, de->d_name);
        n++;
    }
    closedir(d);
    if (n)
        qsort(list, (size_t)n, sizeof *list, cmp_str);
    *paths = list;
    return n;
}

int trace_dir_sizes(const char *dir, uint64_t **sizes, size_t *n, size_t *cap, char *err, size_t errlen)
{
    char **paths;
    int np = trace_dir_list(dir, &paths, err, errlen);
    if (np < 0)
        return -1;
    int rc = 0;
    for (int i = 0; i < np; i++) {
        trace_t t;
        if (!rc && trace_load(paths[i], &t, err, errlen) == 0) {
            for (size_t k = 0; k < t.nev; k++) {
                if (t.ev[k].op != 'a' || t.ev[k].size == 0)
                    continue;
                if (*n == *cap) {
                    *cap = *cap ? *cap * 2 : 65536;
                    uint64_t *grown = realloc(*sizes, *cap * sizeof *grown);
                    if (!grown) {
                        rc = fail(err, errlen, "out of memory");
                        break;
                    }
                    *sizes = grown;
                }
                (*sizes)[(*n)++] = t.ev[k].size;
            }
            trace_free(&t);
        } else {
            rc = -1;
        }
        free(paths[i]);
    }
    free(paths);
    return rc ? -1 : np;
}

/* The period of the allocation sizes (trace.h), by the fraction of
 * allocations whose size equals the one P before. O(n^2 / 2) compares. */
size_t trace_period(const trace_t *t)
{
    size_t n = 0;
    uint64_t *a = malloc((t->nalloc + 1) * sizeof *a);
    if (!a)
        return 0;
    for (size_t e = 0; e < t->nev; e++)
        if (t->ev[e].op == 'a')
            a[n++] = t->ev[e].size;
    size_t maxp = n / 2, period = 0;
    double *frac = n >= 8 ? calloc(maxp + 1, sizeof *frac) : NULL;
    double best = 0;
    for (size_t p = 1; frac && p <= maxp; p++) {
        size_t m = 0;
        for (size_t i = 0; i + p < n; i++)
            m += a[i] == a[i + p];
        frac[p] = (double)m / (double)(n - p);
        if (frac[p] > best)
            best = frac[p];
    }
    if (frac && best >= 0.5)
        for (size_t p = 2; p <= maxp && !period; p++)
            if (frac[p] >= best - 0.02)
                period = p;
    free(frac);
    free(a);
    return period;
}

int trace_each_path(const char *prog, char **paths, int n, int (*run)(const char *path))
{
    int failures = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0 || !S_ISDIR(st.st_mode)) {
            failures += run(paths[i]) != 0;
            continue;
        }
        char **list, err[1400];
        int k = trace_dir_list(paths[i], &list, err, sizeof err);
        if (k < 0) {
            fprintf(stderr, "%s: %s\n", prog, err);
            return -1;
        }
        for (int j = 0; j < k; j++) {
            failures += run(list[j]) != 0;
            free(list[j]);
        }
        free(list);
    }
    return failures;
}

uint64_t trace_peak_live(const trace_t *t)
{
    uint64_t live = 0, peak = 0;
    for (size_t e = 0; e < t->nev; e++) {
        if (t->ev[e].op == 'e')
            continue;
        live = t->ev[e].op == 'a' ? live + t->ev[e].size : live - t->ev[e].size;
        if (live > peak)
            peak = live;
    }
    return peak;
}
