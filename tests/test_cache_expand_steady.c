/* Expandable segments in a repeating job (issue 21): once the first step has
 * run, a step makes no driver call that creates, maps, unmaps or releases
 * memory (expandable_move_budget:0, the default), counted on the CUDA
 * stand-in with cuda_standin_calls; with moves unlimited (-1) the same job
 * makes calls every step, so the count can fail. Also on the host backend:
 * what the budget allows, and a random workload's invariants without moves.
 * The shared ddp trace (../shared/traces, TALLY_TRACES) is replayed too
 * when present. Each case runs in a child (vmmutil.h). */
#include "vmmutil.h"

#include "cache/cache.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include "trace.h"

/* The calls that move memory (a steady step makes none of them). */
static const char *const memory_entries[] = {"cuMemCreate", "cuMemMap",  "cuMemRelease",     "cuMemSetAccess",
                                             "cuMemUnmap",  "cuMemAlloc", "cuMemFree",       "cuCtxSynchronize",
                                             "cuStreamSynchronize"};
enum { NMEM = sizeof memory_entries / sizeof memory_entries[0] };

typedef unsigned long long (*calls_fn)(const char *);
static calls_fn si_calls;
static void (*si_reset)(void);

static void load_counters(void)
{
    start_driver();
    *(void **)&si_calls = dlsym(cu_lib, "cuda_standin_calls");
    *(void **)&si_reset = dlsym(cu_lib, "cuda_standin_counts_reset");
    NEED(si_calls != NULL && si_reset != NULL);
}

static unsigned long long memory_calls(void)
{
    unsigned long long n = 0;
    for (int i = 0; i < NMEM; i++)
        n += si_calls(memory_entries[i]);
    return n;
}

/* ---- a synthetic training step ---------------------------------------------
 * Weights (a live set) first; then each step: a forward pass whose layers
 * keep activations of mixed sizes (1 MiB to 48 MiB, and small ones), a
 * workspace taken and freed in each layer, a loss, then the backward pass
 * freeing activations in reverse while gradients come and go, and an
 * optimizer temporary. The same sizes in the same order every step. */
enum { LAYERS = 12, PER_LAYER = 6, MAXLIVE = LAYERS * PER_LAYER + 64 };

typedef struct job {
    void *weights[16];
    void *act[LAYERS][PER_LAYER];
} job_t;

static size_t act_size(int l, int k)
{
    static const size_t mib[PER_LAYER] = {3, 48, 12, 1, 20, 7};
    return mib[k] * MiB + (size_t)(l % 3) * 4096 + (k == 3 ? 1000 : 0);
}

static void *must(size_t size)
{
    void *p = tally_malloc(size, 0, NULL);
    NEED(p != NULL);
    return p;
}

static void job_begin(job_t *j)
{
    for (int w = 0; w < 16; w++)
        j->weights[w] = must((size_t)(w % 4 + 1) * 16 * MiB + (size_t)w * 512);
}

static void job_step(job_t *j)
{
    for (int l = 0; l < LAYERS; l++) {
        void *ws = must(64 * MiB + (size_t)l * 2 * MiB);
        for (int k = 0; k < PER_LAYER; k++)
            j->act[l][k] = must(act_size(l, k));
        void *tmp = must(300 * 1024);
        tally_free(ws);
        tally_free(tmp);
    }
    void *loss = must(512);
    for (int l = LAYERS - 1; l >= 0; l--) {
        void *grad = must(act_size(l, 1) + 5 * MiB);
        for (int k = PER_LAYER - 1; k >= 0; k--)
            tally_free(j->act[l][k]);
        void *g2 = must(24 * MiB);
        tally_free(grad);
        tally_free(g2);
    }
    void *opt = must(96 * MiB);
    tally_free(opt);
    tally_free(loss);
}

static void job_end(job_t *j)
{
    for (int w = 0; w < 16; w++)
        tally_free(j->weights[w]);
}

/* Steps 2 to 6 of the job on the stand-in: memory driver calls per step
 * written to fd (5 counts), after tally_check. */
static void body_steps(int fd)
{
    load_counters();
    NEED(tally_init() == 0);
    job_t j;
    job_begin(&j);
    job_step(&j);
    unsigned long long per[5];
    for (int s = 0; s < 5; s++) {
        si_reset();
        job_step(&j);
        per[s] = memory_calls();
    }
    NEED(tally_check() == 0);
    job_end(&j);
    NEED(write(fd, per, sizeof per) == (ssize_t)sizeof per);
}

static void steps_under(const char *conf, unsigned long long per[5])
{
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_MEMORY", "16G", "TALLY_CONF", conf, NULL};
    memset(per, 0, 5 * sizeof per[0]);
    int st = run_child(env, body_steps, per, 5 * sizeof per[0]);
    if (st != 0)
        fail_msg("child ended with status %d (see its line above)", st);
}

static void test_steady_step_makes_no_memory_driver_call(void **state)
{
    (void)state;
    unsigned long long per[5];
    steps_under("backend:cuda,expandable_segments:true,leak_report:off", per);
    for (int s = 0; s < 5; s++) {
        if (per[s])
            fail_msg("step %d made %llu memory driver calls (create, map, release, set access, unmap, alloc, free, "
                     "context or stream synchronise); a steady step makes none",
                     s + 2, per[s]);
    }
}

/* The count sees calls: with moves unlimited the same job moves idle pages
 * every step (the churn issue 21 measured). */
static void test_unlimited_moves_make_calls_every_step(void **state)
{
    (void)state;
    unsigned long long per[5];
    steps_under("backend:cuda,expandable_segments:true,expandable_move_budget:-1,leak_report:off", per);
    for (int s = 0; s < 5; s++)
        if (!per[s])
            fail_msg("step %d made no memory driver call with expandable_move_budget:-1", s + 2);
}

/* ---- the shared ddp trace on the stand-in ------------------------------- */

static const char *traces_dir(void)
{
    const char *d = getenv("TALLY_TRACES");
    return d && *d ? d : "../shared/traces";
}

static char ddp_path[1024];

/* Replays the trace; for each step after the first (steps of trace_period
 * allocations from the second period's lowest live point), its memory
 * driver calls; writes the count of steps then the counts. */
static void body_ddp(int fd)
{
    char err[512];
    trace_t t;
    NEED(trace_load(ddp_path, &t, err, sizeof err) == 0);
    size_t period = trace_period(&t);
    NEED(period > 0);
    load_counters();
    NEED(tally_init() == 0);
    /* Event index of each allocation, and the live bytes before it. */
    size_t *aev = malloc(t.nalloc * sizeof *aev), na = 0, phase = period;
    uint64_t *live = malloc(t.nalloc * sizeof *live), cur = 0;
    NEED(aev && live);
    for (size_t e = 0; e < t.nev; e++) {
        if (t.ev[e].op == 'a') {
            aev[na] = e;
            live[na++] = cur;
            cur += t.ev[e].size;
        } else {
            cur -= t.ev[e].size;
        }
    }
    for (size_t i = period; i < 2 * period && i < na; i++)
        if (live[i] < live[phase])
            phase = i;
    void **ptrs = calloc(t.nalloc, sizeof *ptrs);
    unsigned long long counts[16] = {0};
    int steps = 0;
    size_t next = phase;
    for (size_t e = 0, a = 0; e < t.nev; e++) {
        if (t.ev[e].op == 'a') {
            if (a == next) {
                if (next > phase && steps < 16)
                    counts[steps++] = memory_calls();
                si_reset();
                next = a + period <= na ? a + period : SIZE_MAX;
            }
            a++;
            if (t.ev[e].size)
                NEED((ptrs[t.ev[e].slot] = tally_malloc(t.ev[e].size, 0, NULL)) != NULL);
        } else {
            tally_free(ptrs[t.ev[e].slot]);
            ptrs[t.ev[e].slot] = NULL;
        }
    }
    NEED(tally_check() == 0);
    NEED(write(fd, &steps, sizeof steps) == (ssize_t)sizeof steps);
    NEED(write(fd, counts, sizeof counts) == (ssize_t)sizeof counts);
    free(aev);
    free(live);
    free(ptrs);
    trace_free(&t);
}

static void test_ddp_trace_steady_steps_make_no_memory_driver_call(void **state)
{
    (void)state;
    snprintf(ddp_path, sizeof ddp_path, "%s/ddp-rank1-5steps.csv", traces_dir());
    struct stat st;
    if (stat(ddp_path, &st) != 0) {
        SKIP("no %s (CI has ../shared/traces beside the repo)", ddp_path);
    }
    const char *const env[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_MEMORY", "32G", "TALLY_CONF",
                               "backend:cuda,expandable_segments:true,leak_report:off", NULL};
    struct {
        int steps;
        unsigned long long counts[16];
    } out = {0};
    int rc = run_child(env, body_ddp, &out, sizeof out);
    if (rc != 0)
        fail_msg("child ended with status %d (see its line above)", rc);
    if (out.steps < 3)
        fail_msg("only %d whole steps found in %s", out.steps, ddp_path);
    for (int s = 0; s < out.steps; s++)
        if (out.counts[s])
            fail_msg("ddp step %d after the first made %llu memory driver calls", s + 1, out.counts[s]);
}

/* ---- host backend: what the budget allows ------------------------------- */

static void host_conf(const char *extra)
{
    char conf[256];
    snprintf(conf, sizeof conf,
             "backend:host,host_mode:virtual,host_capacity:1GiB,expandable_segments:true,expandable_grow_chunk_mb:2,"
             "leak_report:off%s",
             extra);
    NEED(tally_configure(conf) == 0);
    NEED(tally_init() == 0);
}

static tally_host_calls_t host_calls(void)
{
    tally_host_calls_t c;
    NEED(tally_host_calls(0, &c) == 0);
    return c;
}

/* Blocks of mib[0..n) MiB in a row (each one map call, so one handle with a
 * budget), those whose bit is set in holes freed, then a block of big_mib
 * MiB: the rise of peak reserved and the unmap calls it brought. */
static void holes_then(const size_t *mib, int n, unsigned holes, size_t big_mib, int64_t *peak_rise,
                       uint64_t *unmaps)
{
    void *p[8];
    for (int i = 0; i < n; i++)
        p[i] = must(mib[i] * MiB);
    tally_stats_t full = stats0();
    for (int i = 0; i < n; i++)
        if (holes >> i & 1)
            tally_free(p[i]);
    tally_host_calls_t before = host_calls();
    void *big = must(big_mib * MiB);
    *peak_rise = stats0().reserved_bytes[TALLY_POOL_ALL].peak - full.reserved_bytes[TALLY_POOL_ALL].peak;
    *unmaps = host_calls().unmap - before.unmap;
    NEED(tally_check() == 0);
    for (int i = 0; i < n; i++)
        if (!(holes >> i & 1))
            tally_free(p[i]);
    tally_free(big);
}

/* Two holes, the first of first_mib MiB and the second of 20 MiB (it merges
 * with the free end of the range), then a 40 MiB block that does not fit in
 * the first: it goes on the second hole's pages and needs 10 more. The
 * budget decides whether the first hole's pages move under it (the peak
 * holds, one unmap call) or new pages are mapped (the peak rises by 20 MiB,
 * no unmap). */
static void holes_of_then_big(size_t first_mib, int64_t *peak_rise, uint64_t *unmaps)
{
    const size_t mib[] = {first_mib, 20, 20};
    holes_then(mib, 3, 5, 40, peak_rise, unmaps);
}

static void holes_then_big(int64_t *peak_rise, uint64_t *unmaps)
{
    holes_of_then_big(20, peak_rise, unmaps);
}

static void body_budget_zero(int fd)
{
    host_conf("");
    int64_t rise;
    uint64_t unmaps;
    holes_then_big(&rise, &unmaps);
    NEED(rise == (int64_t)(20 * MiB) && unmaps == 0);
    (void)fd;
}

static void body_budget_unlimited(int fd)
{
    host_conf(",expandable_move_budget:-1");
    int64_t rise;
    uint64_t unmaps;
    holes_then_big(&rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    (void)fd;
}

/* A budget pays for moves up to their modelled cost per step, which is per
 * call and per handle, not per page: moving the first hole's handle of 10
 * pages costs a synchronise, its unmap and release, and the new block's
 * create, map and access (20 + 51.2 + 230.45 = 301.65 us at A100 costs,
 * where ten one-page moves would be 2.8 ms). 1 ms pays for it, 300 us does
 * not. */
static void body_budget_some(int fd)
{
    host_conf(",expandable_move_budget:1000");
    int64_t rise;
    uint64_t unmaps;
    holes_then_big(&rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    NEED(tally_configure("expandable_move_budget:300") == 0);
    tally_empty_cache(0);
    /* The budget of the window already begun stays; the next one is 300 us. */
    for (int i = 0; i < 1000; i++)
        tally_free(must(512));
    holes_then_big(&rise, &unmaps);
    NEED(rise == (int64_t)(20 * MiB) && unmaps == 0);
    (void)fd;
}

/* The budget comes back once per step (every 1000 allocations until a
 * step is known), not at each allocation: 600 us pays for one move of a
 * 10-page handle (301.65 us), not for a second in the same window (298.35
 * us left); the next window pays again. */
static void body_budget_per_window(int fd)
{
    host_conf(",expandable_move_budget:600");
    int64_t rise;
    uint64_t unmaps;
    holes_then_big(&rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    holes_then_big(&rise, &unmaps);
    NEED(rise == (int64_t)(20 * MiB) && unmaps == 0);
    for (int i = 0; i < 1000; i++)
        tally_free(must(512));
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    holes_then_big(&rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    (void)fd;
}

/* A move takes what the budget pays for, the first handles of a run: two
 * neighbouring holes of 20 MiB (two handles of 10 pages, one run), a third
 * hole after a live block, then a 60 MiB block that fits only in the third
 * and the free end (20 pages short). 310 us pays for the block's map call,
 * one run and one handle (301.65 us), not a second handle (352.85): 10
 * pages move and 10 are new (the peak rises by 20 MiB, one unmap); 1 ms
 * pays for both. */
static void two_holes_then_bigger(int64_t *peak_rise, uint64_t *unmaps)
{
    const size_t mib[] = {20, 20, 20, 20};
    holes_then(mib, 4, 11, 60, peak_rise, unmaps);
}

static void body_budget_partial(int fd)
{
    host_conf(",expandable_move_budget:310");
    int64_t rise;
    uint64_t unmaps;
    two_holes_then_bigger(&rise, &unmaps);
    NEED(rise == (int64_t)(20 * MiB) && unmaps == 1);
    NEED(tally_configure("expandable_move_budget:1000") == 0);
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    for (int i = 0; i < 1000; i++) /* the next window, at 1 ms */
        tally_free(must(512));
    two_holes_then_bigger(&rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    (void)fd;
}

/* Within a budget a move takes no idle handle larger than the pages still
 * wanted: the first hole (30 MiB, one handle of 15 pages) is not unmapped
 * for a need of 10 pages, however large the budget, and new pages are
 * mapped instead; a hole of 20 MiB (10 pages) is taken. With moves
 * unlimited (a handle per page) the 15 pages move. */
static void body_budget_no_larger_handle(int fd)
{
    host_conf(",expandable_move_budget:1000000");
    int64_t rise;
    uint64_t unmaps;
    holes_of_then_big(30, &rise, &unmaps);
    NEED(rise == (int64_t)(20 * MiB) && unmaps == 0);
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    holes_of_then_big(20, &rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    NEED(tally_configure("expandable_move_budget:-1") == 0);
    tally_empty_cache(0);
    tally_reset_peak_stats(0);
    holes_of_then_big(30, &rise, &unmaps);
    NEED(rise == 0 && unmaps == 1);
    (void)fd;
}

static void test_budget_zero_maps_new_pages_instead_of_moving(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_zero);
}

static void test_unlimited_budget_moves_idle_pages(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_unlimited);
}

static void test_budget_pays_for_moves_up_to_its_cost(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_some);
}

static void test_budget_comes_back_per_window_not_per_allocation(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_per_window);
}

static void test_budget_pays_for_the_first_handles_of_a_run(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_partial);
}

static void test_budget_takes_no_idle_handle_larger_than_the_need(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_no_larger_handle);
}

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg, (void)text, (void)len;
}

/* Without moves: random sizes on a small device (OOM included, which may
 * unmap), one handle per map call; every invariant holds, all goes back. */
static void body_random(int fd)
{
    NEED(tally_configure("backend:host,host_mode:virtual,host_capacity:256MiB,expandable_segments:true,"
                         "leak_report:off") == 0);
    NEED(tally_init() == 0);
    tally_set_sink(discard, NULL);
    /* Bursts: allocate a random number of blocks (a quarter large, up to
     * 96 MiB; the rest small), then free a random number of the newest. */
    enum { SLOTS = 160 };
    void *live[SLOTS] = {0};
    int top = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 3000; round++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int grow = (int)(x % 9), shrink = (int)(x >> 8) % 9;
        for (int g = 0; g < grow && top < SLOTS; g++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t size = x % 4 == 0 ? (size_t)(x >> 20) % (96 * MiB) + MiB : (size_t)(x >> 24) % MiB + 1;
            void *q = tally_malloc(size, 0, NULL);
            if (q)
                live[top++] = q;
        }
        for (int k = 0; k < shrink && top > 0; k++)
            tally_free(live[--top]);
        if (round % 1000 == 999)
            tally_empty_cache(0);
        if (round % 100 == 0)
            NEED(tally_check() == 0);
    }
    while (top > 0)
        tally_free(live[--top]);
    NEED(tally_check() == 0);
    tally_empty_cache(0);
    NEED(stats0().reserved_bytes[TALLY_POOL_ALL].current == 0);
    (void)fd;
}

static void test_random_workload_without_moves_keeps_invariants(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_random);
}

/* The step detector (lib/cache/expand_move.c) fed directly: a job of 40
 * allocations a step (each size and live figure its own). Its period is
 * found once the first 8 sizes come round again, but the job counts as
 * steady only after a whole step has held (the 8 that found it included),
 * exactly from the 80th allocation; a change ends it. */
static void body_detector(int fd)
{
    (void)fd;
    NEED(tally_configure("backend:host,host_mode:virtual,expandable_segments:true,leak_report:off") == 0);
    NEED(tally_init() == 0);
    tally_device_t *d = tally__g.dev[0];
    enum { P = 40 };
    uint64_t n = 0;
    for (int step = 0; step < 4; step++)
        for (int k = 0; k < P; k++, n++) {
            tally__expand_note_alloc_locked(d, (size_t)(k + 1) << 20, (uint64_t)k * 4096);
            /* The period is found at the 8th repeat (after P + 8), those 8
             * count as held, and the job is steady once P have held: from
             * the 2P-th allocation on. */
            NEED(tally__expand_steady(d) == (n + 1 >= 2 * P));
        }
    NEED(tally__expand_steady(d));
    NEED(tally__expand_period(d) == P);
    tally__expand_note_alloc_locked(d, 999 << 20, 0); /* off the step */
    NEED(!tally__expand_steady(d));
    NEED(tally__expand_period(d) == 0);
}

static void test_step_detector_steady_after_a_whole_step(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_detector);
}

/* A step longer than STEADY_RUN (256 allocations in expand_move.c): the job
 * counts as steady once 256 allocations have held, not a whole step: a
 * step of 300 is found at allocation 308 (its first 8 sizes again, which
 * count as held) and steady from allocation 300 + 256 on. */
static void body_detector_long_step(int fd)
{
    (void)fd;
    NEED(tally_configure("backend:host,host_mode:virtual,expandable_segments:true,leak_report:off") == 0);
    NEED(tally_init() == 0);
    tally_device_t *d = tally__g.dev[0];
    enum { P = 300, RUN = 256 };
    uint64_t n = 0;
    for (int step = 0; step < 3; step++)
        for (int k = 0; k < P; k++, n++) {
            tally__expand_note_alloc_locked(d, (size_t)(k + 1) << 20, (uint64_t)k * 4096);
            if (tally__expand_steady(d) != (n + 1 >= P + RUN))
                fprintf(stderr, "allocation %llu: steady %d\n", (unsigned long long)(n + 1), tally__expand_steady(d));
            NEED(tally__expand_steady(d) == (n + 1 >= P + RUN));
        }
    NEED(tally__expand_period(d) == P);
}

static void test_step_detector_long_step_steady_after_256(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_detector_long_step);
}

/* The budget set at run time watches small requests too: the step detector
 * sees every allocation once a budget is on, so tally_configure must take
 * small requests off the cache's fast path (tally__g.small_fast), which
 * does not feed the detector. A job of P small allocations a step, each
 * freed before the next step (so that a fast path could serve every step
 * after the first from the cache), is steady after two steps. */
static void body_budget_at_run_time(int fd)
{
    (void)fd;
    NEED(tally_configure("backend:host,host_mode:virtual,expandable_segments:true,leak_report:off") == 0);
    NEED(tally_init() == 0);
    NEED(tally_configure("expandable_move_budget:50000") == 0);
    tally_device_t *d = tally__g.dev[0];
    enum { P = 20 }; /* the detector's shortest period is 16 */
    void *p[P];
    for (int step = 0; step < 4; step++) {
        for (int k = 0; k < P; k++)
            NEED((p[k] = tally_malloc((size_t)(k + 1) * 4096, 0, NULL)) != NULL);
        for (int k = 0; k < P; k++)
            tally_free(p[k]);
    }
    NEED(tally__expand_steady(d));
    NEED(tally__expand_period(d) == P);
    NEED(tally_check() == 0);
}

static void test_budget_set_at_run_time_watches_small_requests(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_budget_at_run_time);
}

/* The key: runtime, shown by tally_write_options, -1 to 2^30 only. */
static char options_text[16384];
static size_t options_len;

static void text_out(void *arg, const char *text, size_t len)
{
    (void)arg;
    if (options_len + len < sizeof options_text) {
        memcpy(options_text + options_len, text, len);
        options_len += len;
        options_text[options_len] = 0;
    }
}

static void body_key(int fd)
{
    (void)fd;
    NEED(tally_configure("backend:host,expandable_segments:true,leak_report:off") == 0);
    NEED(tally_configure("expandable_move_budget:-2") != 0);
    NEED(strstr(tally_last_error(), "expandable_move_budget") != NULL);
    NEED(tally_configure("expandable_move_budget:lots") != 0);
    NEED(tally_configure("expandable_move_budget:1073741825") != 0);
    NEED(tally_init() == 0);
    NEED(tally_configure("expandable_move_budget:5000") == 0); /* runtime: after init too */
    NEED(tally_write_options(text_out, NULL) == 0);
    NEED(strstr(options_text, "expandable_move_budget:5000") != NULL);
}

static void test_move_budget_key(void **state)
{
    (void)state;
    const char *const env[] = {"TALLY_CONF", "", NULL};
    expect_child_ok(env, body_key);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steady_step_makes_no_memory_driver_call),
        cmocka_unit_test(test_unlimited_moves_make_calls_every_step),
        cmocka_unit_test(test_ddp_trace_steady_steps_make_no_memory_driver_call),
        cmocka_unit_test(test_budget_zero_maps_new_pages_instead_of_moving),
        cmocka_unit_test(test_unlimited_budget_moves_idle_pages),
        cmocka_unit_test(test_budget_pays_for_moves_up_to_its_cost),
        cmocka_unit_test(test_budget_comes_back_per_window_not_per_allocation),
        cmocka_unit_test(test_budget_pays_for_the_first_handles_of_a_run),
        cmocka_unit_test(test_budget_takes_no_idle_handle_larger_than_the_need),
        cmocka_unit_test(test_random_workload_without_moves_keeps_invariants),
        cmocka_unit_test(test_move_budget_key),
        cmocka_unit_test(test_step_detector_steady_after_a_whole_step),
        cmocka_unit_test(test_step_detector_long_step_steady_after_256),
        cmocka_unit_test(test_budget_set_at_run_time_watches_small_requests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
