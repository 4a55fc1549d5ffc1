/* tally-steps: the driver calls of each step of a repeating trace.
 *
 *   tally-steps [--conf KEYS] [--period N] [--per-step] [--unannounced]
 *               [--alias-model [--alias-policy P] [--alias-pages N]] TRACE.csv|DIR ...
 *   tally-steps --gen-repeat LIVE_MIB,BLOCK_MIB,ITERS FILE
 *
 * Replays each trace through tally (device 0; configuration as tally-replay:
 * backend:host,host_mode:virtual,host_capacity:80GiB, then $TALLY_CONF, then
 * --conf), each in a process of its own as a job is (so what the cache
 * learned of one trace, such as the step expandable_move_budget finds, does
 * not carry into the next), and splits it into steps. With the cuda backend on the CUDA
 * stand-in (LD_LIBRARY_PATH=build/standin) the driver calls of each step are
 * read from the stand-in's counters (cuda_standin_calls, found with dlsym on
 * the loaded libcuda.so.1) by entry point, with the modelled driver time of
 * tests/standin/cost.c's table (cuda_standin_driver_us, both columns); on
 * the host backend only backend calls (map, unmap, segment allocations and
 * frees) are counted.
 *
 * Steps. A training job repeats the same sequence of allocation sizes each
 * step, so the step is the period of that sequence: the smallest shift P
 * (in allocations) at which the sizes agree with themselves shifted by P
 * nearly as often as at the best shift (within 2 points of the best match
 * fraction, at least half of all allocations, and at least two whole
 * periods). --period N sets it. Steps begin at the allocation where live
 * bytes are lowest within the second period (the boundary between two
 * steps), and every P allocations after it; step 1 is everything before the
 * second boundary (warm-up and the first step), the trace's tail after the
 * last whole step is counted in the totals only.
 *
 * --alias-model also runs bench/alias_model.c's model of mapping idle
 * handles at second addresses (CUDA's virtual aliasing) on tally's placement
 * of the large-pool blocks, and prints its peak and its driver calls per
 * step, and the handles a static assignment would need ("alias model"
 * lines; docs/benchmarks.md, run N). --alias-policy: which idle handle a
 * page takes (lowest, lru, mru, fewest, own: the default); --alias-pages:
 * handles of N x 2 MiB (1).
 *
 * --gen-repeat writes the shape of issue 21's attention benchmark: a live
 * set of LIVE_MIB (in 64 MiB pieces), then ITERS iterations that each
 * allocate a BLOCK_MIB block, a 16 MiB output kept until the next iteration,
 * and free the block; the first iteration also takes a workspace of
 * 3.5 x LIVE_MIB and frees it (a first-call workspace, as cuDNN's
 * benchmark mode does). */
#include "alias_model.h"
#include "trace.h"
#include "../tests/standin/cost.h"

#include <tally.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB 1048576ull

/* The driver entry points reported one by one; the rest are "other". */
static const char *const entries[] = {"cuMemCreate",         "cuMemMap",         "cuMemRelease",
                                      "cuMemSetAccess",      "cuMemUnmap",       "cuMemAlloc",
                                      "cuMemFree",           "cuMemAddressReserve", "cuMemAddressFree",
                                      "cuCtxSynchronize",    "cuStreamSynchronize"};
enum { NENTRY = sizeof entries / sizeof entries[0], FIRST_SYNC = 9 };

typedef unsigned long long (*calls_fn)(const char *);
typedef double (*us_fn)(int);
static calls_fn si_calls, si_mappings;
static us_fn si_us;

typedef struct counts {
    unsigned long long entry[NENTRY], maps[NENTRY], all;
    double us[2];
    long long backend; /* map + unmap + segment allocations + frees */
} counts_t;

static void read_counts(counts_t *c)
{
    memset(c, 0, sizeof *c);
    if (si_calls) {
        for (int i = 0; i < NENTRY; i++)
            c->entry[i] = si_calls(entries[i]), c->maps[i] = si_mappings ? si_mappings(entries[i]) : 0;
        c->all = si_calls(NULL);
        c->us[0] = si_us(0);
        c->us[1] = si_us(1);
    }
    tally_stats_t s;
    if (tally_get_stats(0, &s) == 0)
        c->backend = s.num_device_alloc + s.num_device_free;
}

static counts_t diff(const counts_t *a, const counts_t *b)
{
    counts_t d;
    for (int i = 0; i < NENTRY; i++)
        d.entry[i] = b->entry[i] - a->entry[i], d.maps[i] = b->maps[i] - a->maps[i];
    d.all = b->all - a->all;
    d.us[0] = b->us[0] - a->us[0];
    d.us[1] = b->us[1] - a->us[1];
    d.backend = b->backend - a->backend;
    return d;
}

/* Modelled time of the memory calls and the synchronise before an unmap
 * (cost.c's table), without the context and stream calls. */
static double memory_us(const counts_t *c, int column)
{
    double us = 0;
    for (int i = 0; i < NENTRY; i++)
        us += si_cost_us(entries[i], c->entry[i], c->maps[i], column);
    return us;
}

/* The calls that move memory (a steady step should make none), and the
 * synchronises before an unmap. */
static unsigned long long memory_calls(const counts_t *c)
{
    unsigned long long n = 0;
    for (int i = 0; i < FIRST_SYNC; i++)
        n += c->entry[i];
    return n;
}

static unsigned long long sync_calls(const counts_t *c)
{
    unsigned long long n = 0;
    for (int i = FIRST_SYNC; i < NENTRY; i++)
        n += c->entry[i];
    return n;
}

/* ---- steps ---------------------------------------------------------------- */

/* Allocation index -> event index, and the step boundaries (event indexes
 * of the allocations that begin steps 2, 3, ...). Returns their number. */
static size_t boundaries(const trace_t *t, size_t period, size_t **out)
{
    size_t na = 0;
    size_t *aev = malloc((t->nalloc + 1) * sizeof *aev);
    uint64_t *livebefore = malloc((t->nalloc + 1) * sizeof *livebefore);
    uint64_t live = 0;
    for (size_t e = 0; e < t->nev; e++) {
        if (t->ev[e].op == 'a') {
            aev[na] = e;
            livebefore[na] = live;
            na++;
            live += t->ev[e].size;
        } else {
            live -= t->ev[e].size;
        }
    }
    size_t nb = 0;
    *out = NULL;
    if (period && 2 * period <= na) {
        size_t phase = period;
        for (size_t i = period; i < 2 * period; i++)
            if (livebefore[i] < livebefore[phase])
                phase = i;
        *out = malloc((na / period + 2) * sizeof **out);
        for (size_t i = phase; i + period <= na || i == phase; i += period)
            (*out)[nb++] = aev[i];
        /* The last boundary closes the last whole step. */
    }
    free(aev);
    free(livebefore);
    return nb;
}

/* ---- replay ---------------------------------------------------------------- */

/* Stream of dense index i: the trace's stream 0 is NULL; others are
 * distinct pointers on the host backend and real streams of device 0 on
 * the stand-in (made once, trace_cuda_stream). */
static void *cuda_lib;
static void *stream_of(const trace_t *t, unsigned i)
{
    static void *made[64];
    if (t->stream_ids[i] == 0)
        return NULL;
    if (!cuda_lib || !strstr(tally_backend_name(), "cuda"))
        return (void *)(uintptr_t)(0x1000u + i);
    if (!made[i] && !(made[i] = trace_cuda_stream())) {
        fprintf(stderr, "tally-steps: cannot make a stream on device 0\n");
        exit(1);
    }
    return made[i];
}

static void print_counts(const char *label, const counts_t *c, double per)
{
    printf("  %s:", label);
    for (int i = 0; i < NENTRY; i++)
        if (c->entry[i])
            printf(" %s %.1f", entries[i], (double)c->entry[i] / per);
    printf(" | other %.1f | backend %.1f | A100 %.3f ms (memory calls %.3f) | Blackwell %.3f ms (memory calls %.3f)\n",
           (double)(c->all - memory_calls(c) - sync_calls(c)) / per, (double)c->backend / per, c->us[0] / per / 1000,
           memory_us(c, 0) / per / 1000, c->us[1] / per / 1000, memory_us(c, 1) / per / 1000);
}

static bool alias_on; /* --alias-model */
static int alias_policy = ALIAS_OWN;
static unsigned alias_pages = 1;
static const char *const alias_policies[] = {"lowest", "lru", "mru", "fewest", "own"};

static alias_counts_t alias_diff(const alias_counts_t *a, const alias_counts_t *b)
{
    return (alias_counts_t){.create = b->create - a->create, .map = b->map - a->map,
                            .access = b->access - a->access, .unmap = b->unmap - a->unmap, .sync = b->sync - a->sync};
}

static uint64_t alias_calls(const alias_counts_t *c)
{
    return c->create + c->map + c->access + c->unmap + c->sync;
}

static int run(const char *path, size_t force_period, bool per_step)
{
    char err[1400];
    trace_t t;
    if (trace_load(path, &t, err, sizeof err)) {
        fprintf(stderr, "tally-steps: %s\n", err);
        return 1;
    }
    size_t na = t.nalloc;
    size_t period = force_period ? force_period : trace_period(&t);
    size_t *bound = NULL;
    size_t nb = boundaries(&t, period, &bound);
    void **ptrs = calloc(t.nalloc ? t.nalloc : 1, sizeof *ptrs);
    alias_model_t *am = alias_on ? alias_model_new(alias_policy, alias_pages) : NULL;
    size_t *large = alias_on ? calloc(t.nalloc ? t.nalloc : 1, sizeof *large) : NULL; /* each block's size, if large */
    if (alias_on && (!am || !large)) {
        fprintf(stderr, "tally-steps: out of memory for the alias model\n");
        exit(1);
    }
    alias_counts_t a_mark = {0}, a_now, a_first = {0}, a_steady = {0};
    uint64_t small_peak = 0;
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    tally_reset_accumulated_stats(0);
    counts_t start, mark, now;
    read_counts(&start);
    mark = start;
    counts_t first = {0}, steady = {0}, worst = {0};
    size_t nsteady = 0, b = 0;
    long failed = 0;
    uint64_t live = 0, peak_live = 0;
    for (size_t e = 0; e < t.nev; e++) {
        if (b < nb && e == bound[b]) {
            read_counts(&now);
            counts_t d = diff(&mark, &now);
            if (b == 0) {
                first = d;
            } else {
                nsteady++;
                for (int i = 0; i < NENTRY; i++)
                    steady.entry[i] += d.entry[i], steady.maps[i] += d.maps[i];
                steady.all += d.all;
                steady.us[0] += d.us[0];
                steady.us[1] += d.us[1];
                steady.backend += d.backend;
                if (memory_calls(&d) + (unsigned long long)d.backend >= memory_calls(&worst) + (unsigned long long)worst.backend)
                    worst = d;
            }
            if (am) {
                alias_model_counts(am, &a_now);
                alias_counts_t ad = alias_diff(&a_mark, &a_now);
                if (b == 0) {
                    a_first = ad;
                } else {
                    a_steady.create += ad.create, a_steady.map += ad.map, a_steady.access += ad.access;
                    a_steady.unmap += ad.unmap, a_steady.sync += ad.sync;
                }
                a_mark = a_now;
            }
            if (per_step) {
                char label[32];
                snprintf(label, sizeof label, "step %zu", b + 1);
                print_counts(label, &d, 1);
            }
            mark = now;
            b++;
        }
        const trace_event_t *ev = &t.ev[e];
        if (ev->op == 'a') {
            live += ev->size;
            if (live > peak_live)
                peak_live = live;
            if (ev->size) {
                ptrs[ev->slot] = tally_malloc(ev->size, 0, stream_of(&t, ev->stream));
                failed += ptrs[ev->slot] == NULL;
                tally_block_info_t bi;
                /* Large-pool blocks: over 1 MiB (PyTorch's kSmallSize). */
                if (am && ptrs[ev->slot] && !tally_block_info(ptrs[ev->slot], &bi) && bi.size > MiB) {
                    large[ev->slot] = bi.size;
                    if (alias_model_take(am, (uintptr_t)ptrs[ev->slot], bi.size)) {
                        fprintf(stderr, "tally-steps: out of memory for the alias model\n");
                        exit(1);
                    }
                }
            }
        } else {
            live -= ev->size;
            if (am && large[ev->slot])
                alias_model_give(am, (uintptr_t)ptrs[ev->slot], large[ev->slot]);
            if (am)
                large[ev->slot] = 0;
            tally_free(ptrs[ev->slot]);
            ptrs[ev->slot] = NULL;
        }
        if (am) {
            tally_stats_t small;
            tally_get_stats(0, &small);
            alias_model_note_small(am, (uint64_t)small.reserved_bytes[TALLY_POOL_SMALL].current);
            if ((uint64_t)small.reserved_bytes[TALLY_POOL_SMALL].current > small_peak)
                small_peak = (uint64_t)small.reserved_bytes[TALLY_POOL_SMALL].current;
        }
    }
    read_counts(&now);
    counts_t whole = diff(&start, &now);
    tally_stats_t s;
    tally_get_stats(0, &s);
    int bad = tally_check() != 0;
    printf("%s: %zu allocations, period %zu, %zu steady steps; peak live %.1f MiB, peak reserved %.1f MiB "
           "(%.4f)%s%s\n",
           t.name, na, period, nsteady, (double)peak_live / MiB, (double)s.reserved_bytes[0].peak / MiB,
           peak_live ? (double)s.reserved_bytes[0].peak / (double)peak_live : 0, failed ? ", FAILED ALLOCATIONS" : "",
           bad ? ", TALLY_CHECK FAILED" : "");
    if (nb)
        print_counts("step 1 (warm-up)", &first, 1);
    if (nsteady) {
        print_counts("steady step (mean)", &steady, (double)nsteady);
        print_counts("steady step (worst)", &worst, 1);
    }
    print_counts("whole trace", &whole, 1);
    double ns = nsteady ? (double)nsteady : 1;
    printf("  summary | %s | %.1f | %.1f | %.4f | %.1f | %.1f | %.3f | %.3f | %llu | %.3f | %.3f |\n", t.name,
           (double)peak_live / MiB, (double)s.reserved_bytes[0].peak / MiB,
           peak_live ? (double)s.reserved_bytes[0].peak / (double)peak_live : 0,
           (double)(memory_calls(&steady) + sync_calls(&steady)) / ns, (double)steady.backend / ns,
           memory_us(&steady, 0) / ns / 1000, memory_us(&steady, 1) / ns / 1000, memory_calls(&whole) + sync_calls(&whole),
           memory_us(&whole, 0) / 1000, memory_us(&whole, 1) / 1000);
    if (am) {
        alias_model_counts(am, &a_now);
        long sh = alias_model_static(am);
        double st = (double)((uint64_t)(sh > 0 ? sh : 0) * alias_model_page(am) + small_peak);
        printf("  alias model | %s | %.1f | %.1f | %.4f | %llu | %.1f | %.3f | %llu | %.3f | %.3f | %ld | %.1f | %.4f |\n",
               t.name,
               (double)peak_live / MiB, (double)a_now.peak_reserved / MiB,
               peak_live ? (double)a_now.peak_reserved / (double)peak_live : 0,
               (unsigned long long)alias_calls(&a_first), (double)alias_calls(&a_steady) / ns,
               alias_model_us(&a_steady, SI_COST_A100) / ns / 1000, (unsigned long long)alias_calls(&a_now),
               alias_model_us(&a_now, SI_COST_A100) / 1000, alias_model_us(&a_now, SI_COST_BLACKWELL) / 1000, sh,
               st / MiB, peak_live ? st / (double)peak_live : 0);
    }
    for (size_t k = 0; k < t.nalloc; k++)
        tally_free(ptrs[k]);
    tally_empty_cache(0);
    free(ptrs);
    free(large);
    alias_model_free(am);
    free(bound);
    trace_free(&t);
    return bad || failed;
}

static int gen_repeat(const char *spec, const char *path)
{
    unsigned long long live_mib, block_mib, iters;
    if (sscanf(spec, "%llu,%llu,%llu", &live_mib, &block_mib, &iters) != 3 || !live_mib || !block_mib || !iters)
        return fprintf(stderr, "tally-steps: --gen-repeat LIVE_MIB,BLOCK_MIB,ITERS\n"), 2;
    FILE *f = fopen(path, "w");
    if (!f)
        return perror(path), 1;
    unsigned long long id = 0, out = 0;
    fprintf(f, "op,id,size,stream\n");
    for (unsigned long long m = 0; m < live_mib; m += 64)
        fprintf(f, "a,%llu,%llu,0\n", ++id, (live_mib - m < 64 ? live_mib - m : 64) * MiB);
    for (unsigned long long i = 0; i < iters; i++) {
        unsigned long long ws = 0;
        if (i == 0)
            fprintf(f, "a,%llu,%llu,0\n", ws = ++id, live_mib * 7 / 2 * MiB);
        unsigned long long blk = ++id;
        fprintf(f, "a,%llu,%llu,0\n", blk, block_mib * MiB);
        if (ws)
            fprintf(f, "f,%llu,%llu,0\n", ws, live_mib * 7 / 2 * MiB);
        if (out)
            fprintf(f, "f,%llu,%llu,0\n", out, 16 * MiB);
        fprintf(f, "a,%llu,%llu,0\n", out = ++id, 16 * MiB);
        fprintf(f, "f,%llu,%llu,0\n", blk, block_mib * MiB);
    }
    return fclose(f) ? 1 : 0;
}

/* tally set up in this process (the first prints the header line). */
static int setup(const char *conf, bool announced, bool header)
{
    /* As under PyTorch with tally.install(): every capture is announced, so
     * the cached path makes no driver call (--unannounced: a C program that
     * never announces one). */
    if (announced)
        tally_graph_captures_announced();
    if (tally_configure("backend:host,host_mode:virtual,host_capacity:80GiB,leak_report:off,stage_report:false") ||
        (getenv("TALLY_CONF") && *getenv("TALLY_CONF") && tally_configure(getenv("TALLY_CONF"))) ||
        (conf && tally_configure(conf)) || tally_init()) {
        fprintf(stderr, "tally-steps: %s\n", tally_last_error());
        return 1;
    }
    void *cuda = cuda_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (cuda) {
        *(void **)&si_calls = dlsym(cuda, "cuda_standin_calls");
        *(void **)&si_us = dlsym(cuda, "cuda_standin_driver_us");
        *(void **)&si_mappings = dlsym(cuda, "cuda_standin_mappings");
        if (!si_us)
            si_calls = NULL;
    }
    if (header)
        printf("tally-steps: backend %s; driver calls %s\n", tally_backend_name(),
               si_calls ? "counted by the CUDA stand-in" : "not counted (not the stand-in): backend calls only");
    return 0;
}

/* One trace in a process of its own, as one job is: nothing the cache
 * learns of one trace (the step finder of expandable_move_budget, the
 * high-water mark) carries into the next, so a trace's figures do not
 * depend on the traces before it on the command line. Returns 1 if it
 * failed. */
static int in_child(const char *path, const char *conf, bool announced, size_t period, bool per_step, bool header)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("tally-steps: fork");
        return 1;
    }
    if (pid == 0)
        exit(setup(conf, announced, header) || run(path, period, per_step) ? 1 : 0);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return 1;
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int main(int argc, char **argv)
{
    const char *conf = NULL;
    size_t period = 0;
    bool per_step = false, announced = true;
    int first = 1;
    if (argc == 4 && !strcmp(argv[1], "--gen-repeat"))
        return gen_repeat(argv[2], argv[3]);
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "--conf") && first + 1 < argc)
            conf = argv[++first];
        else if (!strcmp(argv[first], "--period") && first + 1 < argc)
            period = strtoul(argv[++first], NULL, 10);
        else if (!strcmp(argv[first], "--per-step"))
            per_step = true;
        else if (!strcmp(argv[first], "--unannounced"))
            announced = false;
        else if (!strcmp(argv[first], "--alias-model"))
            alias_on = true;
        else if (!strcmp(argv[first], "--alias-pages") && first + 1 < argc && atoi(argv[first + 1]) > 0)
            alias_pages = (unsigned)atoi(argv[++first]);
        else if (!strcmp(argv[first], "--alias-policy") && first + 1 < argc) {
            const char *name = argv[++first];
            alias_policy = -1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(name, alias_policies[k]))
                    alias_policy = k;
            if (alias_policy < 0) {
                fprintf(stderr, "tally-steps: --alias-policy '%s': not lowest, lru, mru, fewest or own\n", name);
                return 2;
            }
        }
        else
            break;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: tally-steps [--conf KEYS] [--period N] [--per-step] [--unannounced]\n"
                        "                   [--alias-model [--alias-policy P] [--alias-pages N]] TRACE.csv|DIR ...\n"
                        "       tally-steps --gen-repeat LIVE_MIB,BLOCK_MIB,ITERS FILE\n");
        return 2;
    }
    int failures = 0, done = 0;
    for (int i = first; i < argc; i++) {
        if (is_dir(argv[i])) {
            char **list, err[1400];
            int n = trace_dir_list(argv[i], &list, err, sizeof err);
            if (n < 0)
                return fprintf(stderr, "tally-steps: %s\n", err), 1;
            for (int k = 0; k < n; k++) {
                failures += in_child(list[k], conf, announced, period, per_step, done++ == 0);
                free(list[k]);
            }
            free(list);
        } else {
            failures += in_child(argv[i], conf, announced, period, per_step, done++ == 0);
        }
    }
    printf("  (summary columns: trace | peak live MiB | peak reserved MiB | reserved / live | memory driver calls "
           "per steady step (create, map, release, set access, unmap, synchronise, alloc, free, address reserve and "
           "free) | backend calls per steady step | their A100 ms | Blackwell ms | memory driver calls over the trace "
           "| their A100 ms | Blackwell ms)\n");
    if (alias_on)
        printf("  (alias model columns: trace | peak live MiB | its peak reserved MiB | reserved / live | memory driver "
               "calls in step 1 | per steady step | their A100 ms | over the trace | their A100 ms | Blackwell ms | handles "
               "of the static assignment | they and the small pool's peak, MiB | reserved / live)\n");
    return failures ? 1 : 0;
}
