/* Out of host memory for metadata, at every allocation in turn, as sqlite's
 * tests fail each malloc of a statement: a workload that touches every layer
 * (tags, stages, both pools, a split, stream uses, the ledger, every report,
 * empty_cache, a graph pool) runs once for each metadata allocation it makes, with that
 * allocation failing (tally__meta_fail, lib/core/meta.c), then once more with
 * every allocation failing from that point on. Whatever fails, the library
 * must
 *   - fail the call that needed the memory, with a negative code or NULL and
 *     a one-line message in the sink (never a crash, never a print of its own);
 *   - lose nothing: once memory is back, every block it handed out frees,
 *     tally_check passes, and no device counts an allocated byte;
 *   - keep working: the same workload then runs clean.
 * Each configuration (default, expandable segments, the timeline with sites
 * and the size limits, the allocation trace) runs in its own child, since the
 * configuration is read once. */
#include "ledgerutil.h" /* lu_child_run: a child with jemalloc preloaded */
#include "testutil.h"

#include "core/internal.h"
#include "ledger/stage.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#define NPTR 12

typedef struct {
    void *p[NPTR];
    void *priv[2]; /* blocks of the private tag, when private_tags names it */
    void *graph;   /* a block of a CUDA graph's pool */
    int failed_calls; /* calls that reported a failure */
} work_t;

static char sink_text[1 << 16];
static size_t sink_len;
static int sink_bad_lines;

/* Every diagnostic is one line starting "tally: ". */
static void sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    /* Whole lines, each its own "tally: " prefix. */
    if (!len || text[len - 1] != '\n')
        sink_bad_lines++;
    for (const char *l = text; l < text + len; l = (const char *)memchr(l, '\n', (size_t)(text + len - l)) + 1)
        if ((size_t)(text + len - l) < 7 || strncmp(l, "tally: ", 7) != 0 || !memchr(l, '\n', (size_t)(text + len - l))) {
            sink_bad_lines++;
            break;
        }
    if (sink_len + len < sizeof sink_text) {
        memcpy(sink_text + sink_len, text, len);
        sink_len += len;
    }
}

static void discard(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

#define NOTE(ok)                                                                                                   \
    do {                                                                                                           \
        if (!(ok)) {                                                                                               \
            w->failed_calls++;                                                                                     \
            if (!tally_last_error() || !*tally_last_error()) {                                                     \
                fprintf(stderr, "%s:%d: a call failed with no error message\n", __FILE__, __LINE__);               \
                _exit(3);                                                                                          \
            }                                                                                                      \
        }                                                                                                          \
    } while (0)

/* One round: every layer once, under one of two tag and stage names (so a
 * round after the first two needs no new name or ledger row, and the
 * metadata held after it can be compared). */
static void workload(work_t *w, int round, const char *dir)
{
    char tag[64], stage[64], path[600];
    snprintf(tag, sizeof tag, "faults-tag-%d", round % 2);
    snprintf(stage, sizeof stage, "faults-stage-%d", round % 2);
    static const size_t sizes[NPTR] = {512,       4096,        1 << 20,        (1 << 20) + 1,      3 << 20,  25 << 20,
                                       600,       (2 << 20) + 4096, 11 << 20, 700 << 10, 64,      (40 << 20) + 512};
    int st_ok = tally_stage_begin(stage) == 0;
    NOTE(st_ok);
    int tag_ok = tally_tag_push(tag) == 0;
    NOTE(tag_ok);
    for (int i = 0; i < NPTR; i++) {
        w->p[i] = tally_malloc(sizes[i], i % 2, i % 3 ? STREAM(i % 3) : NULL);
        NOTE(w->p[i] != NULL);
    }
    for (int i = 0; i < NPTR; i += 4)
        if (w->p[i])
            NOTE(tally_record_stream(w->p[i], STREAM(7)) == 0);
    /* Free some so that blocks merge and splits are counted again. */
    for (int i = 1; i < NPTR; i += 3) {
        tally_free(w->p[i]);
        w->p[i] = NULL;
    }
    w->p[1] = tally_malloc(300 << 10, 0, NULL); /* a split of a freed block */
    NOTE(w->p[1] != NULL);
    if (tag_ok)
        NOTE(tally_tag_pop() == 0);
    /* A graph pool (PyTorch's ids (0, n)): begun, allocated from, ended,
     * one block freed into it, released while the other still lives. */
    uint64_t gid = 1 + (uint64_t)(round % 2);
    int gp_ok = tally_graph_pool_begin(0, 0, gid, NULL, NULL) == 0;
    NOTE(gp_ok);
    w->graph = tally_malloc(5 << 20, 0, STREAM(2));
    NOTE(w->graph != NULL);
    void *g2 = tally_malloc(2048, 0, STREAM(2));
    NOTE(g2 != NULL);
    if (gp_ok)
        NOTE(tally_graph_pool_end(0, 0, gid) == 0);
    tally_free(g2);
    if (gp_ok)
        NOTE(tally_graph_pool_release(0, 0, gid) == 0);
    if (tally_tag_is_private("faults-priv") == 1) {
        /* A private tag's segments are reserved and mapped; it sleeps and
         * wakes (offloaded to host memory and back). */
        if (tally_tag_push("faults-priv") == 0) {
            w->priv[0] = tally_malloc(3 << 20, 0, NULL);
            NOTE(w->priv[0] != NULL);
            w->priv[1] = tally_malloc(4096, 0, NULL);
            NOTE(w->priv[1] != NULL);
            NOTE(tally_tag_pop() == 0);
        } else {
            NOTE(0);
        }
        static const char *const priv[] = {"faults-priv"};
        if (tally_sleep(priv, 1, TALLY_SLEEP_OFFLOAD) == 0)
            NOTE(tally_wake(priv, 1) == 0);
        else
            NOTE(0);
    }
    if (st_ok)
        NOTE(tally_stage_end(stage) == 0);
    NOTE(tally_write_summary(0, 0, discard, NULL) == 0);
    NOTE(tally_write_summary(1, 1, discard, NULL) == 0);
    NOTE(tally_write_ledger(discard, NULL) == 0);
    NOTE(tally_write_leaks(0, discard, NULL) == 0);
    NOTE(tally_write_stats_json(0, discard, NULL) == 0);
    snprintf(path, sizeof path, "%s/report-%d.json", dir, round);
    NOTE(tally_write_report(path) == 0);
    unlink(path);
    tally_empty_cache(-1);
}

/* Memory back: everything the round holds frees, and nothing is counted. */
static void settle(work_t *w, int round, const char *what)
{
    tally__meta_fail(0, 0);
    static const char *const priv[] = {"faults-priv"};
    tally_sleep_info_t si;
    if (tally_tag_is_private("faults-priv") == 1 && tally_tag_sleep_info("faults-priv", 0, &si) == 0 && si.asleep &&
        tally_wake(priv, 1) != 0) {
        fprintf(stderr, "round %d (%s): the private tag does not wake once memory is back: %s\n", round, what,
                tally_last_error());
        _exit(12);
    }
    for (int i = 0; i < 2; i++) {
        tally_free(w->priv[i]);
        w->priv[i] = NULL;
    }
    tally_free(w->graph);
    w->graph = NULL;
    for (int i = 0; i < NPTR; i++) {
        tally_free(w->p[i]);
        w->p[i] = NULL;
    }
    tally_empty_cache(-1);
    if (tally_check() != 0) {
        fprintf(stderr, "round %d (%s): tally_check failed: %s\n", round, what, tally_last_error());
        _exit(4);
    }
    for (int d = 0; d < 2; d++) {
        tally_stats_t s;
        if (tally_get_stats(d, &s) != 0 || s.allocated_bytes[0].current != 0 || s.active_bytes[0].current != 0 ||
            s.reserved_bytes[0].current != 0) {
            fprintf(stderr, "round %d (%s): device %d still counts %lld allocated, %lld active, %lld reserved\n",
                    round, what, d, (long long)s.allocated_bytes[0].current, (long long)s.active_bytes[0].current,
                    (long long)s.reserved_bytes[0].current);
            _exit(5);
        }
        /* Nothing reserved: so every backend allocation was freed, every
         * address range unreserved and every page mapped unmapped. */
        tally_host_calls_t c;
        if (tally_host_calls(d, &c) != 0 || c.alloc != c.free || c.reserve != c.unreserve ||
            c.map_pages != c.unmap_pages) {
            fprintf(stderr,
                    "round %d (%s): device %d's backend calls do not balance: %llu allocs, %llu frees, %llu "
                    "reserves, %llu unreserves, %llu pages mapped, %llu unmapped\n",
                    round, what, d, (unsigned long long)c.alloc, (unsigned long long)c.free,
                    (unsigned long long)c.reserve, (unsigned long long)c.unreserve, (unsigned long long)c.map_pages,
                    (unsigned long long)c.unmap_pages);
            _exit(5);
        }
    }
    if (sink_bad_lines) {
        fprintf(stderr, "round %d (%s): the sink got a diagnostic that is not one 'tally: ' line:\n%.*s\n", round,
                what, (int)sink_len, sink_text);
        _exit(6);
    }
    sink_len = 0;
}

/* The child: the workload with the nth allocation failing, for every n the
 * clean run makes, then failing from n on. Exits 0 when all held. */
/* One pass: the workload with the nth allocation failing, for every n the
 * clean run makes, and again failing from n on. Returns the rounds run;
 * *most is the most metadata held after any of them. With limit set, more
 * than limit bytes held after a round is a leak. */
static uint64_t pass(work_t *w, int *round, const char *dir, size_t limit, size_t *most, uint64_t *injected)
{
    uint64_t tried = 0;
    for (uint64_t n = 1; n < 4000; n++) {
        for (int persist = 0; persist < 2; persist++) {
            w->failed_calls = 0;
            tally__meta_fail(n, persist ? 1 : 0);
            workload(w, *round, dir);
            uint64_t hits = tally__meta_fail_hits();
            /* A failure may be absorbed (a cache that is only an
             * optimisation), but the round's results must still be whole:
             * settle checks that. */
            settle(w, (*round)++, persist ? "failing from n on" : "nth failing");
            size_t held = tally__meta_bytes();
            if (limit && held > limit) {
                fprintf(stderr,
                        "round %d (n %llu%s): %zu bytes of metadata held, at most %zu in the first pass: a leak\n",
                        *round - 1, (unsigned long long)n, persist ? ", failing from n on" : "", held, limit);
                _exit(11);
            }
            if (held > *most)
                *most = held;
            *injected += hits;
            tried++;
            if (!hits && !persist) {
                /* The round made fewer than n allocations: every one has
                 * failed in turn. */
                if (n <= 20) {
                    fprintf(stderr, "a round made only %llu metadata allocations\n", (unsigned long long)n - 1);
                    _exit(9);
                }
                return tried;
            }
        }
    }
    fprintf(stderr, "the workload never ran out of allocations to fail\n");
    _exit(10);
}

static void clean_round(work_t *w, int *round, const char *dir, const char *what)
{
    w->failed_calls = 0;
    workload(w, *round, dir);
    if (w->failed_calls) {
        fprintf(stderr, "%s: %d calls failed: %s\n", what, w->failed_calls, tally_last_error());
        _exit(7);
    }
    settle(w, (*round)++, what);
}

/* The child: clean rounds (the stage history full), a pass of faults, then a
 * second pass that must hold no more metadata than the first ever did (a
 * leak on a failure path grows it round by round; the first pass may
 * legitimately add ledger rows, for blocks taken when a push or a stage
 * failed), then a clean round. Exits 0 when all held. */
static void child(const char *conf, const char *dir, bool leak_check, bool in_heap)
{
    tu_conf(conf);
    tally__meta_fail_in_heap(in_heap);
    if (in_heap && strcmp(tally__meta_source(), "jemalloc") == 0) {
        fprintf(stderr, "faults: skipped, the metadata comes from jemalloc, not the tally-heap\n");
        _exit(0);
    }
    tally_set_sink(sink, NULL);
    if (tally_init() != 0) {
        fprintf(stderr, "tally_init: %s\n", tally_last_error());
        _exit(2);
    }
    work_t w = {0};
    int round = 0;
    /* Clean rounds until the stage history (a ring of TALLY_STAGE_HISTORY
     * records, each holding its survivors) is full and both names known. */
    for (int i = 0; i < TALLY_STAGE_HISTORY + 2; i++)
        clean_round(&w, &round, dir, "a clean round");
    size_t most = tally__meta_bytes(), again = 0;
    uint64_t injected = 0;
    uint64_t tried = pass(&w, &round, dir, 0, &most, &injected);
    tried += pass(&w, &round, dir, leak_check ? most : 0, &again, &injected);
    clean_round(&w, &round, dir, "a clean round after the faults");
    fprintf(stderr, "faults: %llu rounds, %llu injected failures\n", (unsigned long long)tried,
            (unsigned long long)injected);
    _exit(0);
}

static void run_at(const char *conf, bool leak_check, bool in_heap)
{
    char dir[] = "/tmp/tally-faults-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(600); /* a child that hangs (a lock left held) ends, failing the test, instead of waiting for good */
        child(conf, dir, leak_check, in_heap);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    rmdir(dir);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("TALLY_CONF=%s: the child %s %d (its message is above)", conf,
                 WIFEXITED(status) ? "exited with status" : "was killed by signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

static void run(const char *conf, bool leak_check)
{
    run_at(conf, leak_check, false);
}

#define BASE "backend:host,host_devices:2,host_capacity:8GiB,host_mode:virtual,leak_report:off"

static void test_out_of_metadata_default(void **state)
{
    (void)state;
    run(BASE, true);
}

/* The same without the device locks' bias, so that every take goes through
 * the futex lock: there a failure path that leaves a device lock held hangs
 * the workload at its next take (the child's alarm ends it), where through
 * the bias the thread would take its own lock again and go on. */
static void test_out_of_metadata_without_the_lock_bias(void **state)
{
    (void)state;
    run(BASE ",lock_bias:false", true);
}

static void test_out_of_metadata_expandable(void **state)
{
    (void)state;
    run(BASE ",expandable_segments:true", true);
}

static void test_out_of_metadata_timeline_sites_and_limits(void **state)
{
    (void)state;
    run(BASE ",timeline:true,backtrace_depth:4,max_split_size_mb:20,garbage_collection_threshold:0.5,"
             "memory_fraction:0.9",
        true);
}

/* A private tag: its segments reserved and mapped, slept and woken. */
static void test_out_of_metadata_private_tag_sleeps(void **state)
{
    (void)state;
    run("backend:host,host_devices:2,host_capacity:1GiB,host_mode:backed,leak_report:off,private_tags:faults-priv",
        true);
}

/* The failures inside the tally-heap (its lock held when a chunk is
 * refused), where tally__meta_alloc's own check has let them through. */
static void test_out_of_metadata_inside_the_heap(void **state)
{
    (void)state;
    run_at(BASE ",expandable_segments:true", true, true);
}

/* The allocation trace keeps every event (it is not a ring), so the
 * metadata it holds grows by design: no leak check here. */
static void test_out_of_metadata_with_the_allocation_trace(void **state)
{
    (void)state;
    run(BASE ",trace:true,expandable_segments:true", false);
}

/* Run body (which _exits with 0 on success) in a fork; the test fails
 * unless it exits 0. */
static void in_fork(void (*body)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        body();
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A name that cannot be stored (no memory for its copy, or for the table
 * growing when it is full) is refused with its message, and the names
 * table stays usable: the same name then goes in. 300 names take the
 * table through several growths. */
static void names_child(void)
{
    tu_conf(BASE);
    tally_set_sink(sink, NULL);
    if (tally_init() != 0 || tally_tag_push("warm") != 0 || tally_tag_pop() != 0)
        _exit(2);
    char name[32];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "fresh-name-%d", i);
        tally__meta_fail(1, 0);
        int rc = tally_tag_push(name);
        tally__meta_fail(0, 0);
        if (rc != -TALLY_ENOMEM || !strstr(tally_last_error(), "out of host memory for names")) {
            fprintf(stderr, "name %d: a push with no memory gave %d: %s\n", i, rc, tally_last_error());
            _exit(3);
        }
        if (tally_tag_push(name) != 0 || tally_tag_pop() != 0) {
            fprintf(stderr, "name %d: refused once memory is back: %s\n", i, tally_last_error());
            _exit(4);
        }
    }
    _exit(0);
}

static void test_names_refused_without_memory_then_taken(void **state)
{
    (void)state;
    in_fork(names_child);
}

/* A block of 4 KiB cached on stream s1 (allocated and freed), then device
 * 0's pointer map filled with 512 B blocks on stream s2 (kept in fill, *n of
 * them) up to its next growth: the next hand-out needs the map to grow.
 * Returns the cached block's address. */
static void *cache_then_fill_map(void *s1, void *s2, void **fill, size_t max, size_t *n)
{
    void *cached = tally_malloc(4096, 0, s1);
    if (!cached)
        _exit(2);
    tally_free(cached);
    tally_device_t *d = tally__g.dev[0];
    *n = 0;
    while ((d->map.count + 1) * 2 <= d->map.mask + 1 && *n < max)
        if (!(fill[(*n)++] = tally_malloc(512, 0, s2)))
            _exit(3);
    return cached;
}

/* A cached small block whose hand-out needs the pointer map to grow, with
 * no memory for it: the allocation is refused with the pointer map named,
 * the block stays cached, and once memory is back the same block is handed
 * out (the fast path leaves such a request to the general one, which can
 * put the block back). Fillers on another stream keep the cached block for
 * the request. */
static void map_growth_child(void)
{
    tu_conf(BASE);
    tally_set_sink(sink, NULL);
    void *s1 = (void *)0x51;
    static void *fill[4096];
    size_t n;
    void *cached = cache_then_fill_map(s1, (void *)0x52, fill, 4096, &n);
    tally__meta_fail(1, 0);
    void *p = tally_malloc(4096, 0, s1);
    tally__meta_fail(0, 0);
    if (p || !strstr(tally_last_error(), "pointer map")) {
        fprintf(stderr, "a hand-out needing a map growth without memory gave %p: %s\n", p, tally_last_error());
        _exit(4);
    }
    if (tally_check() != 0) {
        fprintf(stderr, "after the refusal: %s\n", tally_last_error());
        _exit(5);
    }
    p = tally_malloc(4096, 0, s1);
    if (p != cached) {
        fprintf(stderr, "once memory is back: %p, not the cached block %p\n", p, cached);
        _exit(6);
    }
    tally_free(p);
    for (size_t i = 0; i < n; i++)
        tally_free(fill[i]);
    _exit(tally_check() == 0 ? 0 : 7);
}

static void test_cached_block_refused_cleanly_when_the_pointer_map_cannot_grow(void **state)
{
    (void)state;
    in_fork(map_growth_child);
}

/* Through PyTorch's entry point, an allocation refused for want of host
 * memory (metadata) is raised as an out-of-memory error, with PyTorch's
 * wording, like one refused for want of device memory: code that catches
 * torch.cuda.OutOfMemoryError (batch-size finders) sees both. */
static int raised_oom = -1;
static char raised_msg[1024];
static void raiser(int oom, const char *message)
{
    raised_oom = oom;
    snprintf(raised_msg, sizeof raised_msg, "%s", message);
}

/* The refusal whose message starts "out of host memory" (the pointer map
 * cannot grow to take a cached block), through tally_torch_alloc. */
static void torch_child(void)
{
    tu_conf(BASE);
    tally_set_sink(discard, NULL);
    tally_torch_set_oom_raiser(raiser);
    void *s1 = (void *)0x61;
    static void *fill[4096];
    size_t n;
    cache_then_fill_map(s1, (void *)0x62, fill, 4096, &n);
    tally__meta_fail(1, 0);
    void *p = tally_torch_alloc(4096, 0, s1);
    tally__meta_fail(0, 0);
    if (p || raised_oom != 1 ||
        strcmp(raised_msg, "CUDA out of memory. Tried to allocate 4.00 KiB on device 0. tally: out of host memory for "
                           "the pointer map (the holders by tag and stage were written to tally's diagnostics)")) {
        fprintf(stderr, "a metadata failure gave %p, raised oom=%d: '%s'\n", p, raised_oom, raised_msg);
        _exit(4);
    }
    for (size_t i = 0; i < n; i++)
        tally_free(fill[i]);
    _exit(tally_check() == 0 ? 0 : 5);
}

static void test_out_of_host_memory_through_pytorch_raises_an_oom(void **state)
{
    (void)state;
    in_fork(torch_child);
}

/* A segment whose block record cannot be had goes back at once, the way it
 * came: a private tag's (reserved and mapped whole) unmapped and
 * unreserved, a plain one freed through the backend: nothing counted, the
 * backend's capacity whole again, and every backend allocation (and address
 * range) given back by its own kind of call. The spare block records are
 * dropped first so that the record is allocated; from each metadata
 * allocation of the attempt in turn, every one fails. The requests are
 * large ones (30 MiB), each of which needs a segment of its own. */
static void segment_record_child(bool tagged)
{
    tu_conf(tagged ? "backend:host,host_capacity:1GiB,host_mode:virtual,leak_report:off,private_tags:seg-priv"
                   : "backend:host,host_capacity:1GiB,host_mode:virtual,leak_report:off");
    tally_set_sink(discard, NULL);
    if (tagged && tally_tag_push("seg-priv") != 0)
        _exit(2);
    void *warm = tally_malloc(4096, 0, NULL); /* the tag's pool exists from here */
    if (!warm)
        _exit(2);
    tally_free(warm);
    tally_empty_cache(0);
    tally_host_calls_t before; /* the warm-up's calls */
    if (tally_host_calls(0, &before) != 0)
        _exit(2);
    tally_device_t *d = tally__g.dev[0];
    int failures = 0;
    for (uint64_t nth = 1; nth < 64; nth++) {
        d->spare_blocks = NULL; /* the next block record needs metadata */
        tally__meta_fail(nth, 1); /* from the nth on: the retry after release fails too */
        void *p = tally_malloc(30 << 20, 0, NULL); /* a new segment of the large pool */
        tally__meta_fail(0, 0);
        if (p) {
            tally_free(p);
            break;
        }
        failures++;
        tally_stats_t st;
        size_t free_b = 0, total = 0;
        tally_host_calls_t c;
        if (tally_check() != 0 || tally_get_stats(0, &st) != 0 || st.reserved_bytes[0].current != 0 ||
            st.segment[0].current != 0 || tally_mem_get_info(0, &free_b, &total) != 0 || free_b != total ||
            tally_host_calls(0, &c) != 0 || c.alloc - before.alloc != c.free - before.free ||
            c.reserve - before.reserve != c.unreserve - before.unreserve) {
            fprintf(stderr,
                    "failure %llu left state behind (%zu of %zu bytes free; backend since the loop: %llu allocs, "
                    "%llu frees, %llu reserves, %llu unreserves): %s\n",
                    (unsigned long long)nth, free_b, total, (unsigned long long)(c.alloc - before.alloc),
                    (unsigned long long)(c.free - before.free), (unsigned long long)(c.reserve - before.reserve),
                    (unsigned long long)(c.unreserve - before.unreserve), tally_last_error());
            _exit(3);
        }
    }
    tally_empty_cache(0);
    if (failures < 2 || tally_check() != 0) {
        fprintf(stderr, "%d failures before the allocation went through: %s\n", failures, tally_last_error());
        _exit(4);
    }
    _exit(0);
}

static void private_segment_child(void)
{
    segment_record_child(true);
}

static void plain_segment_child(void)
{
    segment_record_child(false);
}

static void test_private_segment_whose_record_cannot_be_had_goes_back(void **state)
{
    (void)state;
    in_fork(private_segment_child);
}

static void test_plain_segment_whose_record_cannot_be_had_goes_back(void **state)
{
    (void)state;
    in_fork(plain_segment_child);
}

/* Initialisation without memory: each of its metadata allocations in turn
 * fails (a fresh process each time, since initialisation runs once);
 * tally_init then returns an error naming host memory, or succeeds where a
 * failure is tolerated, and never crashes. The last run is the one whose
 * failure initialisation never reaches. */
static int init_child(uint64_t nth)
{
    tu_conf(BASE);
    tally_set_sink(discard, NULL);
    tally__meta_fail(nth, 0);
    int rc = tally_init();
    uint64_t hits = tally__meta_fail_hits();
    tally__meta_fail(0, 0);
    if (!hits)
        return 10; /* past initialisation's last allocation */
    if (rc != 0 && !strstr(tally_last_error(), "out of host memory")) {
        fprintf(stderr, "allocation %llu of initialisation failing gave %d: %s\n", (unsigned long long)nth, rc,
                tally_last_error());
        return 3;
    }
    return 0;
}

static void test_initialisation_without_memory_fails_cleanly(void **state)
{
    (void)state;
    uint64_t nth = 1;
    for (; nth < 256; nth++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            _exit(init_child(nth));
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status))
            fail_msg("allocation %llu of initialisation failing: the process died (signal %d)",
                     (unsigned long long)nth, WTERMSIG(status));
        if (WEXITSTATUS(status) == 10)
            break;
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_true(nth > 2 && nth < 256); /* initialisation allocates, and finishes */
}

/* With jemalloc in the process (preloaded), metadata comes from a jemalloc
 * arena of tally's own, each block with a size header: tally__meta_bytes
 * counts exactly the size asked for (1 for 0) plus that 16-byte header,
 * every byte asked for is usable, a size that cannot take the header is
 * refused, and every free gives back exactly what its allocation counted. */
static int jemalloc_child(void)
{
    if (!dlsym(RTLD_DEFAULT, "mallctl"))
        return 77; /* jemalloc is not installed: nothing preloaded */
    if (strcmp(tally__meta_source(), "jemalloc") != 0) {
        printf("jemalloc is in the process but the metadata comes from %s\n", tally__meta_source());
        return 3;
    }
    static const size_t sizes[] = {0, 1, 7, 16, 100, 4096, 3 * MiB};
    void *p[sizeof sizes / sizeof sizes[0]];
    size_t base = tally__meta_bytes();
    size_t counted = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t before = tally__meta_bytes();
        p[i] = tally__meta_alloc(sizes[i]);
        LU_REQUIRE(p[i] != NULL);
        size_t want = (sizes[i] ? sizes[i] : 1) + 16;
        if (tally__meta_bytes() - before != want) {
            printf("%zu bytes: counted %zu, expected %zu\n", sizes[i], tally__meta_bytes() - before, want);
            return 4;
        }
        counted += want;
        memset(p[i], 0xa5, sizes[i] ? sizes[i] : 1);
    }
    LU_REQUIRE(tally__meta_bytes() - base == counted);
    LU_REQUIRE(tally__meta_alloc(SIZE_MAX - 8) == NULL);
    LU_REQUIRE(tally__meta_bytes() - base == counted);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t before = tally__meta_bytes();
        tally__meta_free(p[i]);
        size_t want = (sizes[i] ? sizes[i] : 1) + 16;
        if (before - tally__meta_bytes() != want) {
            printf("%zu bytes: freeing gave back %zu, expected %zu\n", sizes[i], before - tally__meta_bytes(), want);
            return 5;
        }
    }
    LU_REQUIRE(tally__meta_bytes() == base);
    /* The library runs on it: a block, its free, a clean check. */
    tally_set_sink(discard, NULL);
    void *b = tally_malloc(MiB, 0, NULL);
    LU_REQUIRE(b != NULL);
    tally_free(b);
    LU_REQUIRE(tally_check() == 0);
    return 0;
}

static void test_metadata_from_jemalloc_counts_each_block_exactly(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* A preloaded allocator would come before the sanitizer's runtime,
     * which refuses to start so (make asan, make tsan). */
    SKIP("a preloaded jemalloc cannot come before ASan's or TSan's runtime");
#endif
    static const char *const env[] = {"LD_PRELOAD=libjemalloc.so.2", NULL};
    LU_CHILD_OK_OR_SKIP("jemalloc", BASE, env, "jemalloc (libjemalloc.so.2) is not installed");
}

/* tally__meta_grow, the arrays' doubling (record_stream's uses, the spare
 * events, the small pool's stream sets, the host arena, the cuda backend's
 * kept handles, the report's site list): the items come across, the old
 * block goes back; refused (a size that overflows, no memory), it returns
 * NULL and leaves the old array as it was. */
static void test_meta_grow_keeps_items_or_leaves_them(void **state)
{
    (void)state;
    uint64_t *a = tally__meta_alloc(3 * sizeof *a);
    assert_non_null(a);
    for (uint64_t i = 0; i < 3; i++)
        a[i] = 0x1000 + i;
    size_t base = tally__meta_bytes();
    uint64_t *b = tally__meta_grow(a, 3, 8, sizeof *b);
    assert_non_null(b);
    for (uint64_t i = 0; i < 3; i++)
        assert_int_equal(b[i], 0x1000 + i);
    b[7] = 7; /* the whole new size is there */
    assert_true(tally__meta_bytes() > base); /* a block of 8 replaced one of 3 */
    assert_null(tally__meta_grow(b, 3, SIZE_MAX / 4, sizeof *b));
    assert_null(tally__meta_grow(b, 9, 8, sizeof *b)); /* more items than room */
    tally__meta_fail(1, 0);
    assert_null(tally__meta_grow(b, 3, 16, sizeof *b));
    tally__meta_fail(0, 0);
    for (uint64_t i = 0; i < 3; i++)
        assert_int_equal(b[i], 0x1000 + i);
    uint64_t *c = tally__meta_grow(NULL, 0, 4, sizeof *c); /* a first array */
    assert_non_null(c);
    tally__meta_free(c);
    tally__meta_free(b);
}

int main(int argc, char **argv)
{
    static const lu_role_t roles[] = {{"jemalloc", jemalloc_child}, {NULL, NULL}};
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_metadata_default),
        cmocka_unit_test(test_out_of_metadata_without_the_lock_bias),
        cmocka_unit_test(test_out_of_metadata_expandable),
        cmocka_unit_test(test_out_of_metadata_timeline_sites_and_limits),
        cmocka_unit_test(test_out_of_metadata_private_tag_sleeps),
        cmocka_unit_test(test_out_of_metadata_with_the_allocation_trace),
        cmocka_unit_test(test_out_of_metadata_inside_the_heap),
        cmocka_unit_test(test_names_refused_without_memory_then_taken),
        cmocka_unit_test(test_cached_block_refused_cleanly_when_the_pointer_map_cannot_grow),
        cmocka_unit_test(test_out_of_host_memory_through_pytorch_raises_an_oom),
        cmocka_unit_test(test_private_segment_whose_record_cannot_be_had_goes_back),
        cmocka_unit_test(test_plain_segment_whose_record_cannot_be_had_goes_back),
        cmocka_unit_test(test_initialisation_without_memory_fails_cleanly),
        cmocka_unit_test(test_metadata_from_jemalloc_counts_each_block_exactly),
        cmocka_unit_test(test_meta_grow_keeps_items_or_leaves_them),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    lu_tmpdir_cleanup(); /* the jemalloc child's output files */
    return failed;
}
