/* Hot-path benchmark: cached allocate + free pairs, tally against the
 * process's malloc (glibc, jemalloc or mimalloc, chosen at link time: one
 * binary per allocator, see bench/Makefile) on the same size sequence.
 *
 * Sizes are drawn (fixed seed, with replacement) from the allocation events
 * of the trace CSVs: "small" keeps those <= 256 KiB, "all" keeps every size.
 * Patterns:
 *   pair  p = alloc(s); free(p)
 *   fifo  a ring of W live blocks: free the oldest, allocate the next size
 *   lifo  allocate W blocks, free them newest first (activations in backward)
 * With T threads every thread runs the same pattern on the sequence (from
 * its own offset); tally gets one stream pointer per thread, device 0.
 * Two figures per measurement, both per allocate+free pair:
 *   cpu   CPU time of all threads / pairs of all threads (CLOCK_THREAD_CPUTIME_ID;
 *         time a thread waits off-CPU, preempted or asleep on a lock, is not in it,
 *         so other load on the machine barely moves it)
 *   wall  wall time / pairs of all threads (inverse throughput; includes waiting)
 * A warm-up pass of the whole sequence precedes the timed repetitions, so
 * tally serves from its cache (the backend allocations made while timing are
 * reported, and are 0 when it does). Rounds alternate the system allocator
 * and tally; the median over all repetitions of all rounds is printed.
 *
 * Output: '#' comment lines, then one line per measurement:
 *   R <label> <sizes> <pattern> <threads> <cpu median> <cpu min> <cpu max>
 *     <backend allocs while timed> <wall median> <wall min> <wall max>
 * bench/run.sh turns these into tables. */
#include "trace.h"

#include <tally.h>

#include <dlfcn.h>
#include <errno.h>
#include <gnu/libc-version.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(BENCH_JEMALLOC)
#include <jemalloc/jemalloc.h>
#define SYS_NAME "jemalloc"
#elif defined(BENCH_MIMALLOC)
#include <mimalloc.h>
#define SYS_NAME "mimalloc"
#else
#define SYS_NAME "glibc"
#endif

#define MAX_THREADS 64
#define MAX_WINDOW 1024
#define SEQ_LEN 8192
#define STACK_DEPTH 16 /* extra frames above the allocation call (backtrace cost) */

enum { P_PAIR, P_FIFO, P_LIFO, P_COUNT };
static const char *const pattern_names[P_COUNT] = {"pair", "fifo", "lifo"};
enum { A_SYS, A_TALLY };

/* Keep the compiler from pairing up and deleting malloc/free. */
#define ESCAPE(p) __asm__ __volatile__("" : : "r"(p) : "memory")

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "hotpath: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(2);
}

static inline void *sys_alloc(size_t s, void *stream)
{
    (void)stream;
    void *p = malloc(s);
    if (__builtin_expect(!p, 0))
        die("%s: malloc failed", SYS_NAME);
    return p;
}
static inline void sys_free(void *p)
{
    free(p);
}
static inline void *tally_alloc(size_t s, void *stream)
{
    void *p = tally_malloc(s, 0, stream);
    if (__builtin_expect(!p, 0))
        die("tally_malloc failed: %s", tally_last_error());
    return p;
}
static inline void tally_release(void *p)
{
    tally_free(p);
}

typedef struct worker_state {
    const size_t *seq;
    size_t nseq, pos;
    void *stream;
    void *ring[MAX_WINDOW];
    size_t ring_next;
    int window;
    bool ring_full;
} worker_state_t;

/* One function per (allocator, pattern), with direct calls. Each runs
 * `pairs` allocate+free pairs (lifo: pairs is a multiple of the window). */
#define DEFINE_PATTERNS(NAME, ALLOC, FREE)                                                       \
    static __attribute__((noinline)) void pair_##NAME(worker_state_t *w, size_t pairs)                                   \
    {                                                                                          \
        size_t pos = w->pos;                                                                   \
        for (size_t k = 0; k < pairs; k++) {                                                   \
            void *p = ALLOC(w->seq[pos], w->stream);                                           \
            ESCAPE(p);                                                                         \
            FREE(p);                                                                           \
            if (++pos == w->nseq)                                                              \
                pos = 0;                                                                       \
        }                                                                                      \
        w->pos = pos;                                                                          \
    }                                                                                          \
    static __attribute__((noinline)) void fifo_##NAME(worker_state_t *w, size_t pairs)                                   \
    {                                                                                          \
        size_t pos = w->pos, j = w->ring_next, win = (size_t)w->window;                        \
        if (!w->ring_full) {                                                                   \
            for (size_t i = 0; i < win; i++) {                                                 \
                w->ring[i] = ALLOC(w->seq[pos], w->stream);                                    \
                if (++pos == w->nseq)                                                          \
                    pos = 0;                                                                   \
            }                                                                                  \
            w->ring_full = true;                                                               \
        }                                                                                      \
        for (size_t k = 0; k < pairs; k++) {                                                   \
            FREE(w->ring[j]);                                                                  \
            w->ring[j] = ALLOC(w->seq[pos], w->stream);                                        \
            if (++pos == w->nseq)                                                              \
                pos = 0;                                                                       \
            if (++j == win)                                                                    \
                j = 0;                                                                         \
        }                                                                                      \
        w->pos = pos;                                                                          \
        w->ring_next = j;                                                                      \
    }                                                                                          \
    static void fifo_drain_##NAME(worker_state_t *w)                                           \
    {                                                                                          \
        if (w->ring_full)                                                                      \
            for (int i = 0; i < w->window; i++)                                                \
                FREE(w->ring[i]);                                                              \
        w->ring_full = false;                                                                  \
        w->ring_next = 0;                                                                      \
    }                                                                                          \
    static __attribute__((noinline)) void lifo_##NAME(worker_state_t *w, size_t pairs)                                   \
    {                                                                                          \
        size_t pos = w->pos, win = (size_t)w->window;                                          \
        for (size_t b = 0; b < pairs / win; b++) {                                             \
            for (size_t i = 0; i < win; i++) {                                                 \
                w->ring[i] = ALLOC(w->seq[pos], w->stream);                                    \
                if (++pos == w->nseq)                                                          \
                    pos = 0;                                                                   \
            }                                                                                  \
            for (size_t i = win; i-- > 0;)                                                     \
                FREE(w->ring[i]);                                                              \
        }                                                                                      \
        w->pos = pos;                                                                          \
    }

DEFINE_PATTERNS(sys, sys_alloc, sys_free)
DEFINE_PATTERNS(tally, tally_alloc, tally_release)

static void run_pattern(int alloc, int pattern, worker_state_t *w, size_t pairs)
{
    switch (pattern * 2 + alloc) {
    case P_PAIR * 2 + A_SYS: pair_sys(w, pairs); break;
    case P_PAIR * 2 + A_TALLY: pair_tally(w, pairs); break;
    case P_FIFO * 2 + A_SYS: fifo_sys(w, pairs); break;
    case P_FIFO * 2 + A_TALLY: fifo_tally(w, pairs); break;
    case P_LIFO * 2 + A_SYS: lifo_sys(w, pairs); break;
    default: lifo_tally(w, pairs); break;
    }
}

static void drain(int alloc, worker_state_t *w)
{
    if (alloc == A_SYS)
        fifo_drain_sys(w);
    else
        fifo_drain_tally(w);
}

/* ---- one measurement ---------------------------------------------------- */

typedef struct shared {
    pthread_barrier_t bar;
    int alloc, pattern, threads, reps;
    size_t pairs; /* per thread per repetition, set after the warm-up */
} shared_t;

typedef struct worker {
    pthread_t th;
    shared_t *sh;
    worker_state_t st;
    double start[64], end[64];        /* wall clock per repetition, taken by the worker itself */
    double cpu_start[64], cpu_end[64]; /* the thread's CPU time */
} worker_t;

static double clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
#define now_ns() clock_ns(CLOCK_MONOTONIC)
#define cpu_ns() clock_ns(CLOCK_THREAD_CPUTIME_ID)

static void worker_body(worker_t *w)
{
    shared_t *sh = w->sh;
    pthread_barrier_wait(&sh->bar); /* start */
    w->start[0] = now_ns();
    size_t warm = w->st.nseq;
    if (sh->pattern == P_LIFO)
        warm = (warm / (size_t)w->st.window + 1) * (size_t)w->st.window;
    run_pattern(sh->alloc, sh->pattern, &w->st, warm);
    w->end[0] = now_ns();
    pthread_barrier_wait(&sh->bar); /* warm-up done */
    pthread_barrier_wait(&sh->bar); /* pairs published */
    for (int r = 0; r < sh->reps; r++) {
        pthread_barrier_wait(&sh->bar);
        w->cpu_start[r] = cpu_ns();
        w->start[r] = now_ns();
        run_pattern(sh->alloc, sh->pattern, &w->st, sh->pairs);
        w->end[r] = now_ns();
        w->cpu_end[r] = cpu_ns();
        pthread_barrier_wait(&sh->bar);
    }
    drain(sh->alloc, &w->st);
}

/* The timed loop runs STACK_DEPTH frames down, so a backtrace of that depth
 * has real frames to record (as it would in an application). */
static __attribute__((noinline)) void descend(int n, worker_t *w)
{
    if (n == 0)
        worker_body(w);
    else
        descend(n - 1, w);
    __asm__ __volatile__("" ::: "memory"); /* not a tail call */
}

static void *worker_main(void *arg)
{
    descend(STACK_DEPTH, arg);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int64_t tally_backend_allocs(void)
{
    tally_stats_t s;
    if (tally_get_stats(0, &s))
        return -1;
    return s.num_device_alloc;
}

/* Wall time of repetition r: first start to last end over the workers (each
 * takes its own timestamps, so the timing does not depend on when the
 * coordinating thread gets a core). */
static double span(const worker_t *w, int threads, int r)
{
    double lo = w[0].start[r], hi = w[0].end[r];
    for (int i = 1; i < threads; i++) {
        if (w[i].start[r] < lo)
            lo = w[i].start[r];
        if (w[i].end[r] > hi)
            hi = w[i].end[r];
    }
    return hi - lo;
}

/* CPU time of repetition r, summed over the workers. */
static double cpu_sum(const worker_t *w, int threads, int r)
{
    double sum = 0;
    for (int i = 0; i < threads; i++)
        sum += w[i].cpu_end[r] - w[i].cpu_start[r];
    return sum;
}

static size_t fixed_pairs; /* --pairs: per thread per repetition, no calibration */

typedef struct result {
    double ns[64 * 8];   /* CPU ns per pair, every repetition of every round */
    double wall[64 * 8]; /* wall-clock ns per pair (wall time / pairs of all threads) */
    int n;
    int64_t backend_allocs;
} result_t;

/* One warm-up and reps timed repetitions; appends to *res. */
static void measure(int alloc, int pattern, int threads, const size_t *seq, size_t nseq, int window, int reps,
                    double rep_ms, result_t *res)
{
    static worker_t workers[MAX_THREADS];
    shared_t sh = {.alloc = alloc, .pattern = pattern, .threads = threads, .reps = reps};
    pthread_barrier_init(&sh.bar, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        worker_t *w = &workers[i];
        memset(w, 0, sizeof *w);
        w->sh = &sh;
        w->st.seq = seq;
        w->st.nseq = nseq;
        w->st.pos = (size_t)i * nseq / (size_t)threads;
        w->st.window = window;
        /* Thread 0 uses the default stream; the others distinct fake streams. */
        w->st.stream = i == 0 ? NULL : (void *)(uintptr_t)(0x10000u + 0x100u * (unsigned)i);
        if (pthread_create(&w->th, NULL, worker_main, w))
            die("%s", "pthread_create failed");
    }
    pthread_barrier_wait(&sh.bar);
    pthread_barrier_wait(&sh.bar);
    double warm_ns = span(workers, threads, 0);
    /* Pairs per thread so a repetition lasts about rep_ms. */
    double pairs = rep_ms * 1e6 * (double)nseq / (warm_ns > 1 ? warm_ns : 1);
    size_t w = (size_t)window;
    size_t p = (size_t)pairs;
    if (p < 4 * w)
        p = 4 * w;
    if (p > 50000000)
        p = 50000000;
    if (fixed_pairs)
        p = fixed_pairs;
    sh.pairs = (p + w - 1) / w * w;
    int64_t before = alloc == A_TALLY ? tally_backend_allocs() : 0;
    pthread_barrier_wait(&sh.bar);
    for (int r = 0; r < reps; r++) {
        pthread_barrier_wait(&sh.bar);
        pthread_barrier_wait(&sh.bar);
        if (res->n < (int)(sizeof res->ns / sizeof res->ns[0])) {
            res->wall[res->n] = span(workers, threads, r) / ((double)sh.pairs * threads);
            res->ns[res->n++] = cpu_sum(workers, threads, r) / ((double)sh.pairs * threads);
        }
    }
    int64_t after = alloc == A_TALLY ? tally_backend_allocs() : 0;
    for (int i = 0; i < threads; i++)
        pthread_join(workers[i].th, NULL);
    pthread_barrier_destroy(&sh.bar);
    res->backend_allocs += after - before;
}

/* ---- size sequences ----------------------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* SEQ_LEN sizes drawn with replacement from those <= limit. */
static size_t *make_sequence(const uint64_t *sizes, size_t n, uint64_t limit, const char *label)
{
    size_t m = 0;
    uint64_t *pool = malloc(n * sizeof *pool);
    if (!pool)
        die("%s", "out of memory");
    for (size_t i = 0; i < n; i++)
        if (sizes[i] <= limit)
            pool[m++] = sizes[i];
    if (!m)
        die("no trace allocation of the '%s' size class", label);
    size_t *seq = malloc(SEQ_LEN * sizeof *seq);
    size_t *sorted = malloc(SEQ_LEN * sizeof *sorted);
    if (!seq || !sorted)
        die("%s", "out of memory");
    rng_state = 0x243F6A8885A308D3ull;
    double total = 0;
    for (size_t i = 0; i < SEQ_LEN; i++) {
        seq[i] = (size_t)pool[rng_next() % m];
        sorted[i] = seq[i];
        total += (double)seq[i];
    }
    qsort(sorted, SEQ_LEN, sizeof *sorted, cmp_size);
    printf("# sizes %s: %d drawn from %zu trace allocations; min %zu, median %zu, mean %.0f, max %zu bytes\n", label,
           SEQ_LEN, m, sorted[0], sorted[SEQ_LEN / 2], total / SEQ_LEN, sorted[SEQ_LEN - 1]);
    free(sorted);
    free(pool);
    return seq;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: hotpath-" SYS_NAME " [options]\n"
            "  --traces DIR      trace CSVs to draw sizes from (default $TALLY_TRACES, else ../shared/traces)\n"
            "  --only sys|tally  measure one allocator (default both)\n"
            "  --label NAME      label of the tally rows (default tally@" SYS_NAME ")\n"
            "  --conf KEYS       extra tally configuration (after the bench defaults and $TALLY_CONF)\n"
            "  --threads LIST    thread counts, e.g. 1,8 (default 1,8)\n"
            "  --sizes LIST      small (<= 256 KiB) and/or all (default small,all)\n"
            "  --patterns LIST   pair,fifo,lifo (default all three)\n"
            "  --window N        live blocks of fifo / lifo (default 64)\n"
            "  --reps N          timed repetitions per round (default 5)\n"
            "  --rounds N        rounds alternating the allocators; the median of all\n"
            "                    repetitions of all rounds is reported (default 3)\n"
            "  --rep-ms MS       target length of one repetition (default 20)\n"
            "  --pairs N         pairs per thread per repetition instead of --rep-ms (for profilers)\n");
    exit(2);
}

static bool in_list(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && strncmp(p, word, n) == 0)
            return true;
        p = c ? c + 1 : NULL;
    }
    return false;
}

static void describe_malloc(void)
{
    Dl_info info;
    void *m = dlsym(RTLD_DEFAULT, "malloc");
    const char *lib = m && dladdr(m, &info) && info.dli_fname ? info.dli_fname : "?";
#if defined(BENCH_JEMALLOC)
    const char *v = "?";
    size_t sz = sizeof v;
    mallctl("version", &v, &sz, NULL, 0);
    printf("# system allocator: jemalloc %s (malloc from %s)\n", v, lib);
    if (!strstr(lib, "jemalloc"))
        die("malloc does not come from jemalloc but from %s", lib);
#elif defined(BENCH_MIMALLOC)
    printf("# system allocator: mimalloc %d (malloc from %s)\n", mi_version(), lib);
    if (!strstr(lib, "mimalloc"))
        die("malloc does not come from mimalloc but from %s", lib);
#else
    printf("# system allocator: glibc %s (malloc from %s)\n", gnu_get_libc_version(), lib);
    if (!strstr(lib, "libc") && !getenv("HOTPATH_ANY_MALLOC")) /* the variable: for sanitizer builds */
        die("malloc does not come from glibc but from %s", lib);
#endif
}

int main(int argc, char **argv)
{
    const char *traces = getenv("TALLY_TRACES");
    const char *only = NULL, *label = "tally@" SYS_NAME, *conf = NULL;
    const char *threads_list = "1,8", *sizes_list = "small,all", *patterns_list = "pair,fifo,lifo";
    int window = 64, reps = 5, rounds = 3;
    double rep_ms = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            usage();
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--traces"))
            traces = v;
        else if (!strcmp(a, "--only"))
            only = v;
        else if (!strcmp(a, "--label"))
            label = v;
        else if (!strcmp(a, "--conf"))
            conf = v;
        else if (!strcmp(a, "--threads"))
            threads_list = v;
        else if (!strcmp(a, "--sizes"))
            sizes_list = v;
        else if (!strcmp(a, "--patterns"))
            patterns_list = v;
        else if (!strcmp(a, "--window"))
            window = atoi(v);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else if (!strcmp(a, "--rep-ms"))
            rep_ms = atof(v);
        else if (!strcmp(a, "--pairs"))
            fixed_pairs = (size_t)strtoull(v, NULL, 10);
        else
            usage();
    }
    if (window < 1 || window > MAX_WINDOW || reps < 1 || reps > 64 || rounds < 1 || rounds > 8 || rep_ms <= 0)
        usage();
    if (only && strcmp(only, "sys") && strcmp(only, "tally"))
        usage();
    if (!traces)
        traces = "../shared/traces";

    /* Bench defaults, then $TALLY_CONF, then --conf: later keys win. */
    if (tally_configure("backend:host,host_mode:virtual,host_capacity:80GiB,leak_report:off,stage_report:false"))
        die("tally_configure: %s", tally_last_error());
    const char *env = getenv("TALLY_CONF");
    if (env && *env && tally_configure(env))
        die("TALLY_CONF: %s", tally_last_error());
    if (conf && tally_configure(conf))
        die("--conf: %s", tally_last_error());
    if (tally_init())
        die("tally_init: %s", tally_last_error());

    uint64_t *sizes = NULL;
    size_t nsizes = 0, cap = 0;
    char err[1200];
    int nfiles = trace_dir_sizes(traces, &sizes, &nsizes, &cap, err, sizeof err);
    if (nfiles < 0)
        die("%s", err);
    if (nfiles == 0)
        die("no .csv traces in %s", traces);

    describe_malloc();
    printf("# tally %s, backend %s; configuration differences from the defaults:%s%s\n", tally_version(),
           tally_backend_name(), conf ? " " : " (none beyond the bench defaults)", conf ? conf : "");
    printf("# traces: %d files in %s, %zu allocation events\n", nfiles, traces, nsizes);
    printf("# window %d, %d rounds of %d repetitions of about %.0f ms, stack depth %d above the allocation call\n",
           window, rounds, reps, rep_ms, STACK_DEPTH);

    static const struct {
        const char *name;
        uint64_t limit;
    } classes[] = {{"small", 256 * 1024}, {"all", UINT64_MAX}};
    for (size_t c = 0; c < 2; c++) {
        if (!in_list(sizes_list, classes[c].name))
            continue;
        size_t *seq = make_sequence(sizes, nsizes, classes[c].limit, classes[c].name);
        for (int p = 0; p < P_COUNT; p++) {
            if (!in_list(patterns_list, pattern_names[p]))
                continue;
            for (const char *t = threads_list; t && *t;) {
                int threads = atoi(t);
                const char *comma = strchr(t, ',');
                t = comma ? comma + 1 : NULL;
                if (threads < 1 || threads > MAX_THREADS)
                    die("bad thread count in '%s'", threads_list);
                /* Rounds alternate the two allocators, so drift in the
                 * machine's speed hits both alike. */
                static result_t res[2];
                memset(res, 0, sizeof res);
                for (int round = 0; round < rounds; round++)
                    for (int a = A_SYS; a <= A_TALLY; a++)
                        if (!only || !strcmp(only, a == A_SYS ? "sys" : "tally"))
                            measure(a, p, threads, seq, SEQ_LEN, window, reps, rep_ms, &res[a]);
                for (int a = A_SYS; a <= A_TALLY; a++) {
                    result_t *r = &res[a];
                    if (!r->n)
                        continue;
                    qsort(r->ns, (size_t)r->n, sizeof r->ns[0], cmp_double);
                    qsort(r->wall, (size_t)r->n, sizeof r->wall[0], cmp_double);
                    printf("R %s %s %s %d %.2f %.2f %.2f %lld %.2f %.2f %.2f\n", a == A_SYS ? SYS_NAME : label,
                           classes[c].name, pattern_names[p], threads, r->ns[r->n / 2], r->ns[0],
                           r->ns[r->n - 1], (long long)r->backend_allocs, r->wall[r->n / 2], r->wall[0],
                           r->wall[r->n - 1]);
                    fflush(stdout);
                }
            }
        }
        free(seq);
    }
    if (!only || !strcmp(only, "tally")) {
        tally_stats_t s;
        if (tally_get_stats(0, &s) == 0)
            printf("# tally after the runs: %lld backend allocations, peak reserved %.1f MiB, live blocks %lld\n",
                   (long long)s.num_device_alloc, (double)s.reserved_bytes[0].peak / 1048576.0,
                   (long long)s.allocation[0].current);
        if (tally_check())
            die("tally_check failed: %s", tally_last_error());
    }
    free(sizes);
    return 0;
}
