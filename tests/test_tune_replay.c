/* Tests for tally tune's replays (the other test_tune_*.c have the readers,
 * the table and the recommendations): the model of PyTorch's expandable
 * segments (tools/pt_expand.c, compiled in) merging a freed block with its
 * free neighbours and empty_cache's unmapped pages with the unmapped rest, and through the command itself (the built ../bin/tally) the
 * pages a tally row maps, as priced in its driver time, and a recorded
 * state's 512-byte remainder kept free; the model seeded from a recorded
 * state (exact figures, the host's memory failing at each allocation in
 * turn, and a grow from a mapped remainder refused when its pages pass the
 * device's capacity). Expected figures are worked out by hand in the comments. */
#include "../bench/trace.c"

#include <stdlib.h>

/* The model's allocations can be made to fail: the one numbered
 * model_fail_at (0: the first; -1: none) returns NULL, as when the host is
 * out of memory; model_callocs counts them. Only pt_expand.c's callocs. */
static long model_fail_at = -1, model_callocs;
static void *model_calloc(size_t n, size_t size)
{
    if (model_callocs++ == model_fail_at)
        return NULL;
    return calloc(n, size);
}
#define calloc model_calloc
#include "../tools/pt_expand.c"
#undef calloc

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "report/json.h"
#include "tuneutil.h"

/* ---- the model of PyTorch's expandable segments ---------------------------------- */

/* Replay the events (op, id, size) through the model on an 80 GiB device;
 * reserved gets the mapped bytes after each event. */
typedef struct hand_ev {
    char op;
    uint64_t id, size;
} hand_ev_t;

static ptx_result_t model_replay(const hand_ev_t *ev, size_t n, int64_t *reserved)
{
    trace_builder_t b;
    trace_t t;
    char err[256];
    assert_int_equal(trace_begin(&b, &t, "hand", err, sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        if (trace_add(&b, ev[i].op, ev[i].id, ev[i].size, 0, err, sizeof err))
            fail_msg("event %zu: %s", i, err);
    trace_end(&b);
    ptx_opts_t o = {.capacity = 80ull << 30};
    ptx_result_t r;
    if (ptx_replay(&t, &o, NULL, &r, reserved, err, sizeof err))
        fail_msg("ptx_replay: %s", err);
    trace_free(&t);
    return r;
}

/* A freed block merges with the free block after it and with the free
 * block before it, so the whole 20 MiB page is one free block again.
 * Worked by hand: A = 10 MiB maps page 0 (20 MiB) and splits it; B = 10
 * MiB takes its rest. Freed B then A (A merges with B after it), or A then
 * B (B merges with A before it): C = 20 MiB fits in page 0, so nothing more
 * is mapped: 1 page in 1 run, 20 MiB reserved throughout. Unmerged, C would
 * grow the segment from B's 10 MiB into page 1 (40 MiB, 2 pages). */
static void test_pytorch_expandable_model_merges_freed_neighbours(void **state)
{
    (void)state;
    static const hand_ev_t next_free[] = {
        {'a', 1, 10u << 20}, {'a', 2, 10u << 20}, {'f', 2, 0}, {'f', 1, 0}, {'a', 3, 20u << 20}};
    static const hand_ev_t prev_free[] = {
        {'a', 1, 10u << 20}, {'a', 2, 10u << 20}, {'f', 1, 0}, {'f', 2, 0}, {'a', 3, 20u << 20}};
    static const hand_ev_t *const cases[] = {next_free, prev_free};
    static const char *const names[] = {"B freed, then A (A merges with the block after it)",
                                        "A freed, then B (B merges with the block before it)"};
    for (int c = 0; c < 2; c++) {
        int64_t reserved[5];
        ptx_result_t r = model_replay(cases[c], 5, reserved);
        for (int i = 0; i < 5; i++)
            if (reserved[i] != 20 << 20)
                fail_msg("%s: %lld MiB mapped after event %d, expected 20", names[c],
                         (long long)(reserved[i] >> 20), i);
        if (r.pages_mapped != 1 || r.map_calls != 1 || r.peak_reserved != 20 << 20)
            fail_msg("%s: %lld pages mapped in %lld runs, peak %lld MiB; expected 1 page in 1 run, peak 20 MiB",
                     names[c], (long long)r.pages_mapped, (long long)r.map_calls, (long long)(r.peak_reserved >> 20));
        assert_int_equal(r.pages_unmapped, 0);
        assert_int_equal(r.segments, 1);
        assert_int_equal(r.oom_event, -1);
    }
}

/* empty_cache unmaps the whole pages inside a free mapped block; when that
 * block ends on a page boundary nothing is split off its end, so the
 * unmapped pages merge with the unmapped rest of the range and a later
 * block maps across them in one run. Worked by hand: A = 40 MiB maps pages
 * 0-1 (one run); freed, then empty_cache unmaps both (one run: 40 MiB back
 * to 0); B = 60 MiB maps pages 0-2 in one run. 2 map runs, 5 pages mapped,
 * 2 unmapped in 1 run; reserved 40, 40, 0, 60 MiB. An empty block split
 * off at the boundary would stand between pages 0-1 and the rest, and B
 * would map them in two runs (3). */
static void test_release_at_a_page_boundary_leaves_one_unmapped_run(void **state)
{
    (void)state;
    static const hand_ev_t ev[] = {{'a', 1, 40u << 20}, {'f', 1, 0}, {'e', 0, 0}, {'a', 2, 60u << 20}};
    int64_t reserved[4];
    ptx_result_t r = model_replay(ev, 4, reserved);
    if (r.map_calls != 2 || r.pages_mapped != 5)
        fail_msg("%lld pages mapped in %lld runs, expected 5 pages in 2 runs", (long long)r.pages_mapped,
                 (long long)r.map_calls);
    assert_int_equal(r.pages_unmapped, 2);
    assert_int_equal(r.unmap_calls, 1);
    static const int64_t want[4] = {40 << 20, 40 << 20, 0, 60 << 20};
    for (int i = 0; i < 4; i++)
        if (reserved[i] != want[i])
            fail_msg("after event %d: %lld MiB reserved, expected %lld", i, (long long)(reserved[i] >> 20),
                     (long long)(want[i] >> 20));
    assert_int_equal(r.peak_reserved, 60 << 20);
}

/* The model started from a recorded state: ranges of the large pool of
 * stream 0 and the live blocks in them (each the allocation of the trace's
 * event of the same number, its first nlive events); the window is the
 * events after them. On an 80 GiB device with 20 MiB pages. Returns
 * ptx_replay's status; err gets its message. */
static int seeded_replay_on(uint64_t capacity, const ptx_range_t *ranges, size_t nranges, const ptx_live_t *live,
                            size_t nlive, const hand_ev_t *ev, size_t nev, ptx_result_t *r, int64_t *reserved,
                            char *err, size_t errlen)
{
    trace_builder_t b;
    trace_t t;
    assert_int_equal(trace_begin(&b, &t, "seeded", err, errlen), 0);
    for (size_t i = 0; i < nev; i++)
        if (trace_add(&b, ev[i].op, ev[i].id, ev[i].size, 0, err, errlen))
            fail_msg("event %zu: %s", i, err);
    trace_end(&b);
    ptx_opts_t o = {.capacity = capacity};
    ptx_start_t st = {ranges, nranges, live, nlive, nlive};
    int rc = ptx_replay(&t, &o, &st, r, reserved, err, errlen);
    trace_free(&t);
    return rc;
}

static int seeded_replay(const ptx_range_t *ranges, size_t nranges, const ptx_live_t *live, size_t nlive,
                         const hand_ev_t *ev, size_t nev, ptx_result_t *r, int64_t *reserved, char *err,
                         size_t errlen)
{
    return seeded_replay_on(80ull << 30, ranges, nranges, live, nlive, ev, nev, r, reserved, err, errlen);
}

/* A recorded range at the start of its segment, all free: 20 MiB at 1 GiB.
 * A request of 30 MiB does not fit in it, so the segment grows from it:
 * one more 20 MiB page is mapped right after the range, in one run, and the
 * block of 30 MiB starts at the range's start (the range and the new page
 * are one free block first). Worked by hand: 1 page mapped in 1 run (the
 * range's own page was mapped before the window: not counted), 40 MiB
 * reserved, one segment. A seed that left an empty block before the range
 * grows from that block, mapping it (nothing) as a run of its own: 2 runs. */
static void test_recorded_range_at_the_segment_start_grows_in_one_run(void **state)
{
    (void)state;
    static const ptx_range_t range[] = {{1ull << 30, 20u << 20, 0, false}};
    static const hand_ev_t ev[] = {{'a', 1, 30u << 20}};
    ptx_result_t r;
    int64_t reserved[1];
    char err[256];
    if (seeded_replay(range, 1, NULL, 0, ev, 1, &r, reserved, err, sizeof err))
        fail_msg("ptx_replay: %s", err);
    if (r.map_calls != 1 || r.pages_mapped != 1)
        fail_msg("%lld pages mapped in %lld runs, expected 1 page in 1 run", (long long)r.pages_mapped,
                 (long long)r.map_calls);
    assert_int_equal(reserved[0], 40 << 20);
    assert_int_equal(r.peak_reserved, 40 << 20);
    assert_int_equal(r.pages_unmapped, 0);
    assert_int_equal(r.unmap_calls, 0);
    assert_int_equal(r.segments, 1);
    assert_int_equal(r.oom_event, -1);
}

/* A recorded range that runs past the end of the model's address space for
 * its pool (the device's 80 GiB and an eighth: 90 GiB of 20 MiB pages from
 * the pool's lowest range, at 1 GiB) is refused as exceeding the device,
 * not mapped in part: 40 MiB starting 20 MiB before that end. */
static void test_recorded_range_past_the_device_is_refused(void **state)
{
    (void)state;
    static const ptx_range_t range[] = {{1ull << 30, 20u << 20, 0, false},
                                        {(1ull << 30) + (90ull << 30) - (20u << 20), 40u << 20, 0, false}};
    static const hand_ev_t window[] = {{'a', 1, 2u << 20}};
    ptx_result_t r;
    int64_t reserved[1];
    char err[256] = "";
    model_fail_at = -1;
    assert_int_equal(seeded_replay(range, 2, NULL, 0, window, 1, &r, reserved, err, sizeof err), -1);
    char want[160];
    snprintf(want, sizeof want, "expandable range at %llu overlaps another or exceeds the device",
             (unsigned long long)range[1].addr);
    assert_string_equal(err, want);
    /* 20 MiB less, it ends at the end and is taken: 20 + 20 MiB mapped. */
    static const ptx_range_t fits[] = {{1ull << 30, 20u << 20, 0, false},
                                       {(1ull << 30) + (90ull << 30) - (20u << 20), 20u << 20, 0, false}};
    if (seeded_replay(fits, 2, NULL, 0, window, 1, &r, reserved, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(reserved[0], 40 << 20);
}

/* The host running out of memory anywhere while the model seeds a recorded
 * state or replays the window is an error ("out of memory", status -1), never
 * a result: each of the model's allocations is made to fail in turn. The
 * state: a range of 40 MiB at 1 GiB with a live block of 2 MiB at 2 MiB into
 * it (so the seed splits free space off before and after it), and one of 20
 * MiB 20 MiB past its end (split off the unmapped rest); the window is
 * empty (the recording began after the last event), or frees the block and
 * allocates 30 MiB. Once the failure comes after the last allocation, the
 * replay succeeds with the figures of a run without failures. */
static void test_out_of_host_memory_while_seeding_is_an_error(void **state)
{
    (void)state;
    static const ptx_range_t range[] = {{1ull << 30, 40u << 20, 0, false},
                                        {(1ull << 30) + (60u << 20), 20u << 20, 0, false}};
    static const ptx_live_t live[] = {{(1ull << 30) + (2u << 20), 2u << 20, 0}};
    static const hand_ev_t window[] = {{'a', 1, 2u << 20}, {'f', 1, 0}, {'a', 2, 30u << 20}};
    for (size_t nev = 1; nev <= 3; nev += 2) {
        ptx_result_t r;
        int64_t reserved[3];
        char err[256];
        model_fail_at = -1;
        model_callocs = 0;
        if (seeded_replay(range, 2, live, 1, window, nev, &r, reserved, err, sizeof err))
            fail_msg("%zu events: ptx_replay without failures: %s", nev, err);
        long total = model_callocs;
        assert_true(total >= 6); /* the pointers, a segment, its head, three splits */
        assert_int_equal(r.peak_reserved, 60 << 20);
        for (size_t i = 0; i < nev; i++) /* the recorded state's 60 MiB; freeing and 30 MiB map nothing more */
            if (reserved[i] != 60 << 20)
                fail_msg("%zu events: %lld MiB mapped after event %zu, expected 60", nev,
                         (long long)(reserved[i] >> 20), i);
        for (long k = 0; k <= total; k++) {
            model_fail_at = k;
            model_callocs = 0;
            err[0] = 0;
            ptx_result_t f;
            int rc = seeded_replay(range, 2, live, 1, window, nev, &f, reserved, err, sizeof err);
            if (k < total && (rc != -1 || strcmp(err, "out of memory") != 0))
                fail_msg("%zu events, allocation %ld of %ld failing: status %d, \"%s\"; expected -1, \"out of "
                         "memory\"",
                         nev, k, total, rc, err);
            if (k == total && (rc != 0 || f.peak_reserved != r.peak_reserved || f.map_calls != r.map_calls))
                fail_msg("%zu events, no allocation failing: status %d, peak %lld, %lld runs; expected 0, %lld, %lld",
                         nev, rc, (long long)f.peak_reserved, (long long)f.map_calls, (long long)r.peak_reserved,
                         (long long)r.map_calls);
        }
    }
    model_fail_at = -1;
}

/* A block that grows the segment from a free remainder of mapped memory is
 * refused when the pages it would map pass the device's capacity: the
 * pages counted are those of the part past the remainder, rounded up to
 * whole 20 MiB pages. A recorded range of 20 MiB at 1 GiB holds a live block
 * of 20 MiB - 511 B (not a size PyTorch makes, so that the free remainder
 * is 511 B), on a device of 40 MiB. A request of 20 MiB + 512 B starts in
 * the remainder and needs 20 MiB + 1 B past it: two pages, 40 MiB, which
 * with the 20 MiB mapped passes 40 MiB, so it is refused (the release of
 * cached memory first frees nothing: the block is live) and nothing more is
 * mapped. Counted as one page (the rounding one byte short), it would fit
 * the check and then map two, 60 MiB on a 40 MiB device. With a device of
 * 60 MiB it is taken: 60 MiB mapped. */
static void test_grow_counts_every_page_past_a_mapped_remainder(void **state)
{
    (void)state;
    static const ptx_range_t range[] = {{1ull << 30, 20u << 20, 0, false}};
    static const ptx_live_t live[] = {{1ull << 30, (20u << 20) - 511, 0}};
    static const hand_ev_t ev[] = {{'a', 1, (20u << 20) - 511}, {'a', 2, (20u << 20) + 512}};
    ptx_result_t r;
    int64_t reserved[2];
    char err[256];
    model_fail_at = -1;
    if (seeded_replay_on(40u << 20, range, 1, live, 1, ev, 2, &r, reserved, err, sizeof err))
        fail_msg("ptx_replay: %s", err);
    if (r.oom_event != 1 || r.peak_reserved != 20 << 20)
        fail_msg("40 MiB device: refused at event %ld with %lld MiB mapped at the peak; expected event 1, 20 MiB",
                 r.oom_event, (long long)(r.peak_reserved >> 20));
    assert_int_equal(r.pages_mapped, 0);
    if (seeded_replay_on(60u << 20, range, 1, live, 1, ev, 2, &r, reserved, err, sizeof err))
        fail_msg("ptx_replay: %s", err);
    assert_int_equal(r.oom_event, -1);
    assert_int_equal(r.peak_reserved, 60 << 20);
    assert_int_equal(r.pages_mapped, 2);
}

/* ---- the command ------------------------------------------------------------------ */



/* tally tune --json ARGS: the rows, parsed (status 0, else the test fails). */
static tally_json_t *tune_rows(const char *path, const char *extra)
{
    run_t r = tune("--json %s '%s'", extra, path);
    if (r.rc != 0)
        fail_msg("tally tune --json %s '%s': status %d: %s", extra, path, r.rc, r.err);
    tally_json_t *rows = tally__json_parse(r.out, strlen(r.out), NULL, 0, NULL);
    if (!rows || rows->type != TALLY_JSON_ARRAY)
        fail_msg("tally tune --json: not a JSON array:\n%s", r.out);
    run_free(&r);
    return rows;
}




/* The model's best fit takes blocks in PyTorch's order of free blocks,
 * (size, address): of two mapped free blocks of the same size, the lower
 * address, when the one after it in that order is no larger with its
 * unmapped tail. Here A (4 MiB at 0) and B (4 MiB at 6 MiB), each followed
 * by an allocated block: A is the fit for 3 MiB; with B's tail unmapped it
 * still is (B's reach, 14 MiB, is larger), and a request over 4 MiB gets
 * none. */
static void test_best_fit_of_equal_sizes_takes_the_lower_address(void **state)
{
    (void)state;
    const uint64_t M = 1ull << 20;
    seg_t s = {.pool = 1, .page = 2 * M};
    blk_t a = {.addr = 0, .size = 4 * M, .mapped = true};
    blk_t x = {.addr = 4 * M, .size = 2 * M, .mapped = true, .allocated = true, .seg = &s};
    blk_t b = {.addr = 6 * M, .size = 4 * M, .mapped = true};
    blk_t y = {.addr = 10 * M, .size = 10 * M, .mapped = true, .allocated = true, .seg = &s};
    s.head = &a;
    a.next = &x, x.prev = &a, x.next = &b, b.prev = &x, b.next = &y, y.prev = &b;
    assert_ptr_equal(best_fit(&s, 3 * M), &a);
    assert_null(best_fit(&s, 5 * M));
    y.allocated = false, y.mapped = false; /* B's tail, unmapped: B reaches 14 MiB */
    assert_ptr_equal(best_fit(&s, 3 * M), &a);
}

/* The row whose idle pages may move (expandable_move_budget:-1) is priced
 * a physical handle per 2 MiB page it maps, counted from the steps of its
 * reserved bytes: 10 MiB then 4 MiB, 10 MiB freed, on a 1 GiB device,
 * reserves 20 MiB (in 2 map calls) and gives none back: 10 pages mapped,
 * none unmapped, one range. On the A100 (tests/standin/cost.c): 10 x (193
 * cuMemCreate + 1.45 cuMemMap + 36 cuMemSetAccess) + 19
 * cuMemAddressReserve = 2323.5 us; on the Blackwell 10 x (13.8 + 1.0 + 69)
 * + 19 = 857.0 us. A mapping and an unmapping counted the wrong way round
 * would price no page made and a negative count of pages gone. */
static void test_tally_row_prices_the_pages_it_maps(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/pages.csv", scratch);
    write_text(path, "op,id,size,stream\na,1,10485760,0\na,2,4194304,0\nf,1,0,0\n");
    tally_json_t *rows = tune_rows(path, "--capacity 1GiB");
    const tally_json_t *row = row_of(rows, "expandable_segments:True,expandable_move_budget:-1", "tally");
    assert_int_equal(jint(row, "peak_reserved_bytes"), 20 * MiB);
    assert_int_equal(jint(row, "backend_calls"), 2);
    assert_float_equal(jnum(row, "driver_us_a100"), 2323.5, 0.06);
    assert_float_equal(jnum(row, "driver_us_blackwell"), 857.0, 0.06);
    tally__json_free(rows);
}

/* The max_split_size_mb candidates are quantiles (25, 50, 75, 90 and 99%)
 * of the allocations above 20 MiB, each rounded up to a MiB, repeats left
 * out. Worked by hand: allocations of 24, 30, 40, 50 and 100 MiB (a 1 MiB
 * one below the cut too), freed again except the last two: sorted, the
 * quantiles pick indices 1, 2, 3, 3, 3 of five, so 30, 40 and 50. Counting
 * the frees instead would find only the three freed ones. */
static void test_split_candidates_are_quantiles_of_the_large_allocations(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/splits.csv", scratch);
    write_text(path, "op,id,size,stream\n"
                     "a,1,25165824,0\na,2,31457280,0\na,3,41943040,0\na,4,52428800,0\na,5,104857600,0\na,6,1048576,0\n"
                     "f,1,25165824,0\nf,2,31457280,0\nf,3,41943040,0\n");
    tally_json_t *rows = tune_rows(path, "--capacity 1GiB");
    char seen[128] = "";
    for (size_t k = 0; k < rows->len; k++) {
        const char *set = tally__json_get(&rows->items[k], "setting")->s;
        const char *alloc = tally__json_get(&rows->items[k], "allocator")->s;
        if (strncmp(set, "max_split_size_mb:", 18) == 0 && !strchr(set, ',') && strcmp(alloc, "PyTorch/tally") == 0) {
            strncat(seen, set + 18, sizeof seen - strlen(seen) - 2);
            strcat(seen, " ");
        }
    }
    assert_string_equal(seen, "30 40 50 ");
    tally__json_free(rows);
}

/* A recorded state's live block is seeded at its own size when what
 * follows it is 512 bytes, the smallest block, and that 512 stays free; it
 * takes only a remainder too small to split (under 512). rem.pickle, made
 * here: a 2 MiB small segment holding, when recording began, 1 MiB free, a
 * live block of 1 MiB - 512 and 512 bytes free; the window allocates 1 MiB
 * and 512 bytes into the free space, then frees them. PyTorch's peak is
 * the 2 MiB segment; the replay of the same setting from the recorded
 * state reserves the same (the 512 bytes fit), where a seed that gave the
 * remainder to the live block needs a second segment (4 MiB). */
static void test_recorded_state_keeps_a_512_byte_remainder_free(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rem.pickle", scratch);
    if (tune_write_pickle(path,
                          "def ev(a, addr, size): return {\"action\": a, \"addr\": addr, \"size\": size, \"stream\": 0}\n"
                          "def blk(addr, size, req, st): return {\"address\": addr, \"frames\": [], \"requested_size\": req, "
                          "\"size\": size, \"state\": st}\n"
                          "d = {\"allocator_settings\": {\"PYTORCH_CUDA_ALLOC_CONF\": \"\"},\n"
                          " \"device_traces\": [[ev(\"alloc\", S, M), ev(\"alloc\", S + 2 * M - 512, 512),\n"
                          "   ev(\"free_requested\", S, M), ev(\"free_requested\", S + 2 * M - 512, 512)]],\n"
                          " \"segments\": [{\"address\": S, \"device\": 0, \"segment_type\": \"small\", \"stream\": 0, "
                          "\"total_size\": 2 * M, \"blocks\": [blk(S, M, 0, \"inactive\"),\n"
                          "   blk(S + M, M - 512, M - 1000, \"active_allocated\"), blk(S + 2 * M - 512, 512, 0, \"inactive\")]}]}") != 0)
        SKIP("python3 is needed to write the snapshot");
    tally_json_t *rows = tune_rows(path, "");
    const tally_json_t *def = &rows->items[0];
    assert_string_equal(tally__json_get(def, "setting")->s, "");
    assert_int_equal(jint(def, "recorded_peak_reserved_bytes"), 2 * MiB);
    assert_int_equal(jint(def, "recorded_replay_peak_reserved_bytes"), 2 * MiB);
    tally__json_free(rows);
    run_t r = tune("'%s'", path);
    assert_int_equal(r.rc, 0);
    if (!strstr(r.out, "replay of the same setting from the recorded state (1 segment, 1 live block): 2.0 MiB; "
                       "difference +0.0 MiB (+0.00%)"))
        fail_msg("table:\n%s", r.out);
    run_free(&r);
}

static int setup(void **state)
{
    (void)state;
    char bin[PATH_MAX - 64];
    return tune_setup("test_tune_replay", "/tmp/tally-tune-replay-XXXXXX", bin, sizeof bin);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pytorch_expandable_model_merges_freed_neighbours),
        cmocka_unit_test(test_release_at_a_page_boundary_leaves_one_unmapped_run),
        cmocka_unit_test(test_recorded_range_at_the_segment_start_grows_in_one_run),
        cmocka_unit_test(test_recorded_range_past_the_device_is_refused),
        cmocka_unit_test(test_out_of_host_memory_while_seeding_is_an_error),
        cmocka_unit_test(test_grow_counts_every_page_past_a_mapped_remainder),
        cmocka_unit_test(test_best_fit_of_equal_sizes_takes_the_lower_address),
        cmocka_unit_test(test_tally_row_prices_the_pages_it_maps),
        cmocka_unit_test(test_recorded_state_keeps_a_512_byte_remainder_free),
        cmocka_unit_test(test_split_candidates_are_quantiles_of_the_large_allocations),
    };
    return cmocka_run_group_tests(tests, setup, tune_teardown);
}
