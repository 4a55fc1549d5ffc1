/* tally-replay: replay allocation traces (op,id,size,stream CSV) through
 * tally and print, per trace, what it cost and how much memory it reserved,
 * next to PyTorch's figures from reference.json and a no-cache baseline.
 *
 *   tally-replay [--conf KEYS] [--reference FILE] [--reps N] [--check] [--quiet] TRACE.csv|DIR ...
 *
 * tally runs on its host backend in virtual mode by default (address space
 * only, never touched): backend:host,host_mode:virtual,host_capacity:80GiB,
 * then $TALLY_CONF, then --conf (later keys win). Stream ids map to distinct
 * stream pointers (id 0: the default stream, NULL). Every trace starts from
 * an empty cache: after a replay the blocks still live are freed, the cache
 * is emptied and the peak and accumulated statistics are reset.
 *
 * Columns (bench/README.md has the definitions):
 *   events           allocation + free events in the trace
 *   ns/op            CPU time of the replay loop / events (median of --reps;
 *                    CLOCK_THREAD_CPUTIME_ID, so it includes the backend's
 *                    system calls but not time spent preempted)
 *   live             peak of the sum of requested sizes of live blocks
 *   tally reserved   peak reserved bytes (segments obtained from the backend)
 *   res/live         tally reserved / live
 *   backend allocs   backend allocation calls (num_device_alloc), from empty
 *   no-cache         peak of the sum over live blocks of the size rounded up
 *                    to 512 B (<= 1 MiB) or to 2 MiB (> 1 MiB): what calling
 *                    the device allocator once per request would reserve
 *   PyTorch reserved pytorch_native_peak_reserved_bytes of reference.json
 *   PyTorch res/live that / peak_live_bytes of reference.json
 *   PyTorch seg allocs  pytorch_native_segment_allocs_in_window
 *   then what the host backend was asked (tally_host_calls, the first
 *   repetition): segment allocations + frees, map calls and the 2 MiB pages
 *   they mapped, unmap calls, pages unmapped and runs of mapped pages among
 *   them, ranges reserved; and the driver calls the cuda backend makes for
 *   the same calls (lib/backend/cuda/vmm.c): cuMemAlloc / cuMemFree 1 each,
 *   cuMemAddressReserve 1 and cuMemAddressFree 1 a range, a map of h
 *   handles 2h + 1 (cuMemCreate + cuMemMap per handle, one
 *   cuMemSetAccess), an unmap one cuStreamSynchronize (the
 *   segment's stream) + one cuMemUnmap per run + one cuMemRelease per
 *   handle taken down; a handle a move took down and mapped again
 *   (reused_handles, moves unlimited) makes neither its cuMemCreate nor its
 *   cuMemRelease.
 * reference.json is looked up next to each trace unless --reference names one. */
#include "trace.h"

#include <tally.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- reference.json: a tiny scanner ------------------------------------- */

#define REF_KEYS 24
typedef struct ref_entry {
    char trace[256];
    int n;
    char keys[REF_KEYS][64];
    double vals[REF_KEYS];
} ref_entry_t;

typedef struct ref_file {
    char path[1024];
    ref_entry_t *e;
    int n;
} ref_file_t;

typedef struct jscan {
    const char *p, *start, *end;
    const char *path;
    char *err;
    size_t errlen;
} jscan_t;

static int jfail(jscan_t *j, const char *what)
{
    int line = 1;
    for (const char *q = j->start; q < j->p && q < j->end; q++)
        line += *q == '\n';
    snprintf(j->err, j->errlen, "%s:%d: %s", j->path, line, what);
    return -1;
}

static void jws(jscan_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

/* A string into out (escapes kept simple: \" \\ \/ and \uXXXX as '?'). */
static int jstring(jscan_t *j, char *out, size_t cap)
{
    size_t n = 0;
    if (j->p >= j->end || *j->p != '"')
        return jfail(j, "expected a string");
    j->p++;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            if (j->p >= j->end)
                break;
            c = *j->p++;
            if (c == 'u') {
                if (j->end - j->p < 4)
                    return jfail(j, "bad \\u escape");
                j->p += 4;
                c = '?';
            } else if (c == 'n') {
                c = '\n';
            } else if (c == 't') {
                c = '\t';
            } else if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'r') {
                return jfail(j, "bad escape in string");
            }
        }
        if (out && n + 1 < cap)
            out[n++] = c;
    }
    if (j->p >= j->end)
        return jfail(j, "unterminated string");
    j->p++;
    if (out)
        out[n] = 0;
    return 0;
}

static int jvalue(jscan_t *j, double *num, char *str, size_t strcap, int depth);

static int jcontainer(jscan_t *j, int depth)
{
    char close = *j->p == '{' ? '}' : ']';
    bool obj = close == '}';
    j->p++;
    jws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        jws(j);
        if (obj) {
            if (jstring(j, NULL, 0))
                return -1;
            jws(j);
            if (j->p >= j->end || *j->p != ':')
                return jfail(j, "expected ':'");
            j->p++;
        }
        if (jvalue(j, NULL, NULL, 0, depth + 1))
            return -1;
        jws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return 0;
        }
        return jfail(j, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

/* Any value; numbers into *num, strings into str (when given). */
static int jvalue(jscan_t *j, double *num, char *str, size_t strcap, int depth)
{
    jws(j);
    if (depth > 64)
        return jfail(j, "nested too deeply");
    if (j->p >= j->end)
        return jfail(j, "unexpected end of file");
    char c = *j->p;
    if (c == '"')
        return jstring(j, str, strcap);
    if (c == '{' || c == '[')
        return jcontainer(j, depth);
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(words[i]);
        if ((size_t)(j->end - j->p) >= l && !strncmp(j->p, words[i], l)) {
            j->p += l;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t n = 0;
        while (j->p < j->end && n + 1 < sizeof buf && strchr("+-0123456789.eE", *j->p))
            buf[n++] = *j->p++;
        buf[n] = 0;
        char *e;
        double v = strtod(buf, &e);
        if (*e)
            return jfail(j, "bad number");
        if (num)
            *num = v;
        return 0;
    }
    return jfail(j, "unexpected character");
}

/* The top-level array of objects; per object its "trace" string and every
 * numeric member. */
static int ref_load(const char *path, ref_file_t *rf, char *err, size_t errlen)
{
    memset(rf, 0, sizeof *rf);
    snprintf(rf->path, sizeof rf->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *g = realloc(text, cap);
            if (!g)
                break;
            text = g;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    fclose(f);
    jscan_t j = {text, text, text + len, path, err, errlen};
    int rc = 0;
    jws(&j);
    if (!text || j.p >= j.end || *j.p != '[') {
        rc = jfail(&j, "expected a top-level array");
        goto out;
    }
    j.p++;
    for (;;) {
        jws(&j);
        if (j.p < j.end && *j.p == ']')
            break;
        if (j.p >= j.end || *j.p != '{') {
            rc = jfail(&j, "expected an object in the top-level array");
            goto out;
        }
        ref_entry_t *g = realloc(rf->e, (size_t)(rf->n + 1) * sizeof *g);
        if (!g) {
            rc = jfail(&j, "out of memory");
            goto out;
        }
        rf->e = g;
        ref_entry_t *e = &rf->e[rf->n++];
        memset(e, 0, sizeof *e);
        j.p++;
        jws(&j);
        if (j.p < j.end && *j.p == '}') {
            j.p++;
        } else {
            for (;;) {
                char key[64];
                jws(&j);
                if (jstring(&j, key, sizeof key)) {
                    rc = -1;
                    goto out;
                }
                jws(&j);
                if (j.p >= j.end || *j.p != ':') {
                    rc = jfail(&j, "expected ':'");
                    goto out;
                }
                j.p++;
                double v = NAN;
                char s[256] = "";
                if (jvalue(&j, &v, s, sizeof s, 1)) {
                    rc = -1;
                    goto out;
                }
                if (!strcmp(key, "trace"))
                    snprintf(e->trace, sizeof e->trace, "%s", s);
                else if (!isnan(v) && e->n < REF_KEYS) {
                    snprintf(e->keys[e->n], sizeof e->keys[0], "%s", key);
                    e->vals[e->n++] = v;
                }
                jws(&j);
                if (j.p < j.end && *j.p == ',') {
                    j.p++;
                    continue;
                }
                if (j.p < j.end && *j.p == '}') {
                    j.p++;
                    break;
                }
                rc = jfail(&j, "expected ',' or '}'");
                goto out;
            }
        }
        jws(&j);
        if (j.p < j.end && *j.p == ',') {
            j.p++;
            continue;
        }
        if (j.p < j.end && *j.p == ']')
            break;
        rc = jfail(&j, "expected ',' or ']'");
        goto out;
    }
out:
    free(text);
    return rc;
}

static const ref_entry_t *ref_find(const ref_file_t *rf, const char *trace)
{
    for (int i = 0; rf && i < rf->n; i++)
        if (!strcmp(rf->e[i].trace, trace))
            return &rf->e[i];
    return NULL;
}

/* The numeric member key of e, or NAN. */
static double ref_get(const ref_entry_t *e, const char *key)
{
    for (int i = 0; e && i < e->n; i++)
        if (!strcmp(e->keys[i], key))
            return e->vals[i];
    return NAN;
}

/* ---- replay -------------------------------------------------------------- */

/* CPU time of this thread: other load on the machine barely moves it. */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t nocache_cost(uint64_t size)
{
    const uint64_t small = 512, big = (uint64_t)2 << 20;
    if (size == 0)
        return 0;
    if (size <= ((uint64_t)1 << 20))
        return (size + small - 1) / small * small;
    return (size + big - 1) / big * big;
}

typedef struct figures {
    uint64_t peak_live, peak_nocache;
    int64_t peak_reserved, peak_requested, backend_allocs, backend_frees;
    double ns_per_op;
    long oom_event; /* -1 if none */
    bool varied;    /* memory figures differed between repetitions */
    bool have_calls; /* host backend: calls below counted */
    tally_host_calls_t calls; /* during the first repetition */
} figures_t;

/* Driver calls of the cuda backend for the host backend's calls (the
 * comment at the top). */
static uint64_t cuda_driver_calls(const tally_host_calls_t *c)
{
    return c->alloc + c->free + c->reserve + c->unreserve + 2 * c->map_handles + c->map + c->unmap + c->unmap_runs +
           c->unmap_handles - 2 * c->reused_handles;
}

static void simulate(const trace_t *t, figures_t *f)
{
    uint64_t live = 0, nc = 0;
    f->peak_live = f->peak_nocache = 0;
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event_t *e = &t->ev[i];
        int64_t sign = e->op == 'a' ? 1 : -1;
        live += (uint64_t)(sign * (int64_t)e->size);
        nc += (uint64_t)(sign * (int64_t)nocache_cost(e->size));
        if (live > f->peak_live)
            f->peak_live = live;
        if (nc > f->peak_nocache)
            f->peak_nocache = nc;
    }
}

static int reset_device(char *err, size_t errlen)
{
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    tally_reset_accumulated_stats(0);
    tally_stats_t s;
    if (tally_get_stats(0, &s))
        return snprintf(err, errlen, "tally_get_stats: %s", tally_last_error()), -1;
    if (s.reserved_bytes[0].current != 0 || s.allocation[0].current != 0) {
        snprintf(err, errlen, "device 0 not empty before a replay (%lld bytes reserved, %lld blocks live)",
                 (long long)s.reserved_bytes[0].current, (long long)s.allocation[0].current);
        return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int replay(const trace_t *t, int reps, bool check, figures_t *f, char *err, size_t errlen)
{
    void **ptrs = calloc(t->nalloc ? t->nalloc : 1, sizeof *ptrs);
    if (!ptrs)
        return snprintf(err, errlen, "out of memory"), -1;
    double ns[64];
    f->oom_event = -1;
    f->varied = false;
    f->have_calls = false;
    for (int r = 0; r < reps; r++) {
        if (reset_device(err, errlen)) {
            free(ptrs);
            return -1;
        }
        memset(ptrs, 0, t->nalloc * sizeof *ptrs);
        tally_host_calls_t c0;
        bool counted = r == 0 && tally_host_calls(0, &c0) == 0;
        double t0 = now_ns();
        long oom = trace_run(t, ptrs, NULL, NULL);
        ns[r] = (now_ns() - t0) / (double)(t->nev ? t->nev : 1);
        tally_host_calls_t c1;
        if (counted && tally_host_calls(0, &c1) == 0) {
            f->have_calls = true;
            f->calls = trace_calls_since(&c0, &c1);
        }
        tally_stats_t s;
        if (tally_get_stats(0, &s)) {
            free(ptrs);
            return snprintf(err, errlen, "tally_get_stats: %s", tally_last_error()), -1;
        }
        if (check && tally_check()) {
            free(ptrs);
            return snprintf(err, errlen, "tally_check after the replay: %s", tally_last_error()), -1;
        }
        if (r == 0) {
            f->peak_reserved = s.reserved_bytes[0].peak;
            f->peak_requested = s.requested_bytes[0].peak;
            f->backend_allocs = s.num_device_alloc;
            f->backend_frees = s.num_device_free;
            f->oom_event = oom;
        } else if (f->peak_reserved != s.reserved_bytes[0].peak || f->backend_allocs != s.num_device_alloc) {
            f->varied = true;
        }
        for (size_t k = 0; k < t->nalloc; k++)
            if (ptrs[k])
                tally_free(ptrs[k]);
    }
    free(ptrs);
    if (reset_device(err, errlen))
        return -1;
    qsort(ns, (size_t)reps, sizeof ns[0], cmp_double);
    f->ns_per_op = ns[reps / 2];
    return 0;
}

/* ---- output -------------------------------------------------------------- */

static void mib(char *buf, size_t len, double bytes)
{
    if (isnan(bytes))
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.1f", bytes / 1048576.0);
}

static void ratio(char *buf, size_t len, double a, double b)
{
    if (isnan(a) || isnan(b) || b <= 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.3f", a / b);
}

static void usage(void)
{
    fprintf(stderr, "usage: tally-replay [--conf KEYS] [--reference FILE] [--reps N] [--check] [--quiet] "
                    "TRACE.csv|DIR ...\n");
    exit(2);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int main(int argc, char **argv)
{
    const char *conf = NULL, *reference = NULL;
    int reps = 5;
    bool check = false, quiet = false;
    char **paths = NULL;
    int npaths = 0;
    char err[1400];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--conf") && i + 1 < argc)
            conf = argv[++i];
        else if (!strcmp(a, "--reference") && i + 1 < argc)
            reference = argv[++i];
        else if (!strcmp(a, "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(a, "--check"))
            check = true;
        else if (!strcmp(a, "--quiet"))
            quiet = true;
        else if (a[0] == '-')
            usage();
        else if (is_dir(a)) {
            char **list;
            int n = trace_dir_list(a, &list, err, sizeof err);
            if (n < 0) {
                fprintf(stderr, "tally-replay: %s\n", err);
                return 1;
            }
            paths = realloc(paths, (size_t)(npaths + n) * sizeof *paths);
            for (int k = 0; k < n; k++)
                paths[npaths++] = list[k];
            free(list);
        } else {
            paths = realloc(paths, (size_t)(npaths + 1) * sizeof *paths);
            paths[npaths++] = strdup(a);
        }
    }
    if (!npaths || reps < 1 || reps > 64)
        usage();

    if (tally_configure("backend:host,host_mode:virtual,host_capacity:80GiB,leak_report:off,stage_report:false")) {
        fprintf(stderr, "tally-replay: tally_configure: %s\n", tally_last_error());
        return 1;
    }
    const char *env = getenv("TALLY_CONF");
    if (env && *env && tally_configure(env)) {
        fprintf(stderr, "tally-replay: TALLY_CONF: %s\n", tally_last_error());
        return 1;
    }
    if (conf && tally_configure(conf)) {
        fprintf(stderr, "tally-replay: --conf: %s\n", tally_last_error());
        return 1;
    }
    if (tally_init()) {
        fprintf(stderr, "tally-replay: %s\n", tally_last_error());
        return 1;
    }

    ref_file_t refs[16];
    int nrefs = 0;
    if (reference) {
        if (ref_load(reference, &refs[0], err, sizeof err)) {
            fprintf(stderr, "tally-replay: %s\n", err);
            return 1;
        }
        nrefs = 1;
    }

    if (!quiet)
        printf("tally %s, backend %s%s%s; %d repetitions per trace, ns/op is the median (CPU time)\n\n", tally_version(),
               tally_backend_name(), conf ? ", --conf " : "", conf ? conf : "", reps);
    printf("| trace | events | ns/op | peak live MiB | tally reserved MiB | tally res/live | tally backend allocs "
           "| tally backend frees | no-cache MiB | no-cache/live | PyTorch reserved MiB | PyTorch res/live | PyTorch seg allocs "
           "| seg allocs + frees | map calls | pages mapped | unmap calls | pages unmapped | unmap runs | ranges reserved "
           "| CUDA driver calls |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int failures = 0, n_ok = 0, n_py = 0, n_beat = 0, n_ref = 0;
    double sum_ratio = 0, sum_ref = 0;
    char notes[8192] = "";
    size_t notes_len = 0;
    for (int i = 0; i < npaths; i++) {
        trace_t t;
        if (trace_load(paths[i], &t, err, sizeof err)) {
            fprintf(stderr, "tally-replay: %s\n", err);
            failures++;
            continue;
        }
        /* reference.json next to the trace, unless one was given. */
        const ref_file_t *rf = NULL;
        if (reference) {
            rf = &refs[0];
        } else {
            char rpath[1100];
            const char *slash = strrchr(t.path, '/');
            if (slash)
                snprintf(rpath, sizeof rpath, "%.*s/reference.json", (int)(slash - t.path), t.path);
            else
                snprintf(rpath, sizeof rpath, "reference.json");
            for (int k = 0; k < nrefs && !rf; k++)
                if (!strcmp(refs[k].path, rpath))
                    rf = &refs[k];
            if (!rf && nrefs < 16 && access(rpath, R_OK) == 0) {
                if (ref_load(rpath, &refs[nrefs], err, sizeof err)) {
                    fprintf(stderr, "tally-replay: %s\n", err);
                    return 1;
                }
                rf = &refs[nrefs++];
            }
        }
        const ref_entry_t *ref = ref_find(rf, t.name);
        figures_t f = {0};
        simulate(&t, &f);
        if (replay(&t, reps, check, &f, err, sizeof err)) {
            fprintf(stderr, "tally-replay: %s: %s\n", t.name, err);
            trace_free(&t);
            failures++;
            continue;
        }
        double py_res = ref_get(ref, "pytorch_native_peak_reserved_bytes");
        double py_live = ref_get(ref, "peak_live_bytes");
        double py_seg = ref_get(ref, "pytorch_native_segment_allocs_in_window");
        char c_live[32], c_res[32], c_rl[32], c_nc[32], c_ncl[32], c_py[32], c_pyl[32], c_seg[32];
        mib(c_live, sizeof c_live, (double)f.peak_live);
        mib(c_res, sizeof c_res, (double)f.peak_reserved);
        ratio(c_rl, sizeof c_rl, (double)f.peak_reserved, (double)f.peak_live);
        mib(c_nc, sizeof c_nc, (double)f.peak_nocache);
        ratio(c_ncl, sizeof c_ncl, (double)f.peak_nocache, (double)f.peak_live);
        mib(c_py, sizeof c_py, py_res);
        ratio(c_pyl, sizeof c_pyl, py_res, py_live);
        if (isnan(py_seg))
            snprintf(c_seg, sizeof c_seg, "-");
        else
            snprintf(c_seg, sizeof c_seg, "%.0f", py_seg);
        char c_calls[256] = "| - | - | - | - | - | - | - | - |";
        const tally_host_calls_t *hc = &f.calls;
        if (f.have_calls)
            snprintf(c_calls, sizeof c_calls, "| %llu | %llu | %llu | %llu | %llu | %llu | %llu | %llu |",
                     (unsigned long long)(hc->alloc + hc->free), (unsigned long long)hc->map,
                     (unsigned long long)hc->map_pages, (unsigned long long)hc->unmap,
                     (unsigned long long)hc->unmap_pages, (unsigned long long)hc->unmap_runs,
                     (unsigned long long)hc->reserve, (unsigned long long)cuda_driver_calls(hc));
        printf("| %s | %zu | %.1f | %s | %s | %s%s | %lld | %lld | %s | %s | %s | %s | %s %s\n", t.name, t.nev,
               f.ns_per_op, c_live, c_res, c_rl, f.oom_event >= 0 ? " (OOM)" : "", (long long)f.backend_allocs,
               (long long)f.backend_frees, c_nc, c_ncl, c_py, c_pyl, c_seg, c_calls);
        fflush(stdout);
#define NOTE(...)                                                                                          \
    do {                                                                                                   \
        if (notes_len < sizeof notes)                                                                      \
            notes_len += (size_t)snprintf(notes + notes_len, sizeof notes - notes_len, __VA_ARGS__);       \
    } while (0)
        if (f.oom_event >= 0)
            NOTE("- %s: out of memory at event %ld (%s); figures are not comparable\n", t.name, f.oom_event + 1,
                 tally_last_error());
        if (f.varied)
            NOTE("- %s: peak reserved or backend allocations differed between repetitions (first shown)\n",
                 t.name);
        if (f.have_calls && (int64_t)(hc->alloc + hc->map) != f.backend_allocs)
            NOTE("- %s: the host backend counted %llu allocations + map calls, tally %lld\n", t.name,
                 (unsigned long long)(hc->alloc + hc->map), (long long)f.backend_allocs);
        if (f.have_calls && (int64_t)(hc->free + hc->unmap) != f.backend_frees)
            NOTE("- %s: the host backend counted %llu frees + unmap calls, tally %lld\n", t.name,
                 (unsigned long long)(hc->free + hc->unmap), (long long)f.backend_frees);
        if ((int64_t)f.peak_live != f.peak_requested)
            NOTE("- %s: tally's requested-bytes peak %lld differs from the trace's peak live %llu\n", t.name,
                 (long long)f.peak_requested, (unsigned long long)f.peak_live);
        if (!isnan(py_live) && fabs(py_live - (double)f.peak_live) > 0.5)
            NOTE("- %s: reference.json peak_live_bytes %.0f differs from this replay's %llu; PyTorch res/live uses "
                 "reference.json's\n",
                 t.name, py_live, (unsigned long long)f.peak_live);
        if (f.oom_event < 0 && f.peak_live > 0) {
            n_ok++;
            sum_ratio += (double)f.peak_reserved / (double)f.peak_live;
            if (ref) {
                n_ref++;
                sum_ref += (double)f.peak_reserved / (double)f.peak_live;
            }
            if (!isnan(py_res)) {
                n_py++;
                n_beat += (double)f.peak_reserved <= py_res;
            }
        }
        trace_free(&t);
    }
    printf("\n");
    if (n_ok)
        printf("tally mean reserved/live over %d trace%s: %.3f\n", n_ok, n_ok == 1 ? "" : "s", sum_ratio / n_ok);
    if (n_ref && n_ref != n_ok)
        printf("tally mean reserved/live over the %d trace%s listed in a reference.json: %.3f\n", n_ref,
               n_ref == 1 ? "" : "s", sum_ref / n_ref);
    if (n_py)
        printf("tally peak reserved <= PyTorch's on %d of %d traces with a PyTorch figure\n", n_beat, n_py);
    if (notes_len)
        printf("notes:\n%s", notes);
    for (int i = 0; i < npaths; i++)
        free(paths[i]);
    free(paths);
    for (int k = 0; k < nrefs; k++)
        free(refs[k].e);
    return failures ? 1 : 0;
}
