/* The host backend's own bookkeeping, seen from outside:
 * - unmap counts each physical handle it takes down once (unmap_handles,
 *   one cuMemRelease per handle on CUDA), whatever the handle's length:
 *   direct backend calls, and expandable segments giving pages back at
 *   empty_cache;
 * - its address arena (host_arena.c) takes a freed segment's extent back
 *   wherever it sits among the live ones, so the next segment of that size
 *   lands at the lowest free address: the freed one.
 *
 * - where the arena's range cannot be reserved (here: an address-space limit
 *   under four times the capacity), each segment is its own mmap, with the
 *   mode's protection: writable memory when backed, no access when virtual
 *   (a child process per mode, under RLIMIT_AS).
 *
 * This process runs with backend:host,host_devices:2,host_mode:virtual,
 * expandable_segments:true,expandable_move_budget:-1. Device 0 is used through the backend directly
 * for its arena; device 1 for the handle counts. */
#include "testutil.h"

#include "backend/backend.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE (2 * MiB)

static void *stream_a = (void *)0x100;

static tally_host_calls_t host_calls(int dev)
{
    tally_host_calls_t c;
    assert_int_equal(tally_host_calls(dev, &c), 0);
    return c;
}

/* ---- unmap_handles ---- */

/* Handles of one page each, and handles of two pages: an unmap counts the
 * handles whose pages it takes down, one each, not their pages. */
static void test_unmap_counts_each_handle_it_takes_down_once(void **state)
{
    (void)state;
    const tally_backend_t *b = &tally__backend_host;
    char why[200];
    void *base = NULL;
    assert_int_equal(b->reserve(1, 8 * PAGE, &base, why, sizeof why), 0);
    char *at = base;
    tally_host_calls_t c0 = host_calls(1);
    /* Pages 0-1 and 3-4, a handle per page; one unmap over all 8 pages. */
    assert_int_equal(b->map(1, at, 2 * PAGE, PAGE, why, sizeof why), 0);
    assert_int_equal(b->map(1, at + 3 * PAGE, 2 * PAGE, PAGE, why, sizeof why), 0);
    tally_host_calls_t c1 = host_calls(1);
    EQ(c1.map_handles - c0.map_handles, 4);
    assert_int_equal(b->unmap(1, at, 8 * PAGE), 0);
    tally_host_calls_t c2 = host_calls(1);
    EQ(c2.unmap_pages - c1.unmap_pages, 4);
    EQ(c2.unmap_handles - c1.unmap_handles, 4);
    /* Pages 0-4 in handles of 2, 2 and 1 pages. */
    assert_int_equal(b->map(1, at, 5 * PAGE, 2 * PAGE, why, sizeof why), 0);
    tally_host_calls_t c3 = host_calls(1);
    EQ(c3.map_handles - c2.map_handles, 3);
    assert_int_equal(b->unmap(1, at + 2 * PAGE, 3 * PAGE), 0); /* the 2-page and the 1-page handle */
    tally_host_calls_t c4 = host_calls(1);
    EQ(c4.unmap_pages - c3.unmap_pages, 3);
    EQ(c4.unmap_handles - c3.unmap_handles, 2);
    assert_int_equal(b->unmap(1, at, 2 * PAGE), 0); /* the first 2-page handle */
    tally_host_calls_t c5 = host_calls(1);
    EQ(c5.unmap_handles - c4.unmap_handles, 1);
    /* Pages already unmapped take no handle down again. */
    assert_int_equal(b->unmap(1, at, 8 * PAGE), 0);
    tally_host_calls_t c6 = host_calls(1);
    EQ(c6.unmap_pages - c5.unmap_pages, 0);
    EQ(c6.unmap_handles - c5.unmap_handles, 0);
    assert_int_equal(b->unreserve(1, base, 8 * PAGE), 0);
}

/* Expandable segments with handles from 8 MiB (and pages free to move,
 * which handles need): a 16 MiB block maps one
 * handle of 8 pages, a 6 MiB block three of one page; empty_cache takes
 * each down as a whole, and counts as many handles as were mapped. */
static void test_empty_cache_releases_the_handles_the_segment_mapped(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("expandable_handle_mb:8"), 0);
    tally_empty_cache(1);
    tally_host_calls_t c0 = host_calls(1);
    void *big = tally_malloc(16 * MiB, 1, stream_a);
    void *small = tally_malloc(6 * MiB, 1, stream_a);
    assert_non_null(big);
    assert_non_null(small);
    tally_host_calls_t c1 = host_calls(1);
    EQ(c1.map_pages - c0.map_pages, 8 + 3);
    EQ(c1.map_handles - c0.map_handles, 1 + 3);
    CHECK_OK();
    tally_free(big);
    tally_empty_cache(1); /* big's handle is wholly idle: it goes */
    tally_host_calls_t c2 = host_calls(1);
    EQ(c2.unmap_pages - c1.unmap_pages, 8);
    EQ(c2.unmap_handles - c1.unmap_handles, 1);
    CHECK_OK();
    tally_free(small);
    tally_empty_cache(1);
    tally_host_calls_t c3 = host_calls(1);
    EQ(c3.unmap_pages - c2.unmap_pages, 3);
    EQ(c3.unmap_handles - c2.unmap_handles, 3);
    EQ(c3.unmap_handles - c0.unmap_handles, c1.map_handles - c0.map_handles);
    EQ(tu_stats(1).reserved_bytes[TALLY_POOL_ALL].current, 0);
    assert_int_equal(tally_configure("expandable_handle_mb:64"), 0);
}

/* ---- the address arena ---- */

static void *seg(size_t size)
{
    char why[200];
    void *p = NULL;
    assert_int_equal(tally__backend_host.alloc(0, size, stream_a, &p, why, sizeof why), 0);
    return p;
}

static void unseg(void *p, size_t size)
{
    assert_int_equal(tally__backend_host.free(0, p, size, stream_a), 0);
}

/* Five segments side by side; freeing one in the middle, the last or the
 * first hands its address to the next segment that fits, lowest first. */
static void test_freed_segment_among_live_ones_is_reused(void **state)
{
    (void)state;
    enum { N = 5 };
    const size_t sz = 4 * MiB;
    char *s[N];
    for (int i = 0; i < N; i++)
        s[i] = seg(sz);
    for (int i = 1; i < N; i++)
        assert_ptr_equal(s[i], s[0] + i * sz); /* rising, side by side */
    /* The middle one (index 2 of 5). */
    unseg(s[2], sz);
    char *again = seg(sz);
    assert_ptr_equal(again, s[2]);
    /* Index 1, then index 3: two holes, the lower one fills first. */
    unseg(s[1], sz);
    unseg(s[3], sz);
    char *lo = seg(sz / 2), *lo2 = seg(sz / 2), *hi = seg(sz);
    assert_ptr_equal(lo, s[1]);
    assert_ptr_equal(lo2, s[1] + sz / 2);
    assert_ptr_equal(hi, s[3]);
    /* The last, then the first. */
    unseg(s[4], sz);
    assert_ptr_equal(seg(sz), s[4]);
    unseg(s[0], sz);
    assert_ptr_equal(seg(sz), s[0]);
    /* All of them gone: one segment of the five's length starts at the first. */
    unseg(s[0], sz);
    unseg(lo, sz / 2);
    unseg(lo2, sz / 2);
    unseg(again, sz);
    unseg(hi, sz);
    unseg(s[4], sz);
    char *all = seg(N * sz);
    assert_ptr_equal(all, s[0]);
    unseg(all, N * sz);
}

/* ---- segments outside the arena ---- */

/* The protection /proc/self/maps gives the mapping holding p ("rw-p",
 * "---p"), in perms (5 bytes); false when no mapping holds it. */
static bool maps_perms(const void *p, char perms[5])
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return false;
    char line[512];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char pr[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, pr) == 3 && (uintptr_t)p >= lo && (uintptr_t)p < hi) {
            memcpy(perms, pr, 5);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* The child: an address-space limit 512 MiB above what the process maps now,
 * a 1 GiB device (its arena would need 4 GiB of addresses), then a 1 MiB
 * block in a 2 MiB segment of its own mmap. Exit 0 when the segment has the
 * mode's protection (and, backed, holds what is written), else 1, saying why. */
static int fallback_child(const char *mode)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (!f || fscanf(f, "%lu", &pages) != 1) {
        fprintf(stderr, "fallback child: cannot read /proc/self/statm\n");
        return 1;
    }
    fclose(f);
    rlim_t limit = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + 512 * MiB;
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        fprintf(stderr, "fallback child: setrlimit failed\n");
        return 1;
    }
    char conf[160];
    snprintf(conf, sizeof conf, "backend:host,host_devices:1,host_mode:%s,host_capacity:1GiB,leak_report:off", mode);
    tu_conf(conf);
    unsigned char *p = tally_malloc(MiB, 0, NULL);
    if (!p) {
        fprintf(stderr, "fallback child (%s): no 1 MiB block under the limit\n", mode);
        return 1;
    }
    char perms[5];
    if (!maps_perms(p, perms)) {
        fprintf(stderr, "fallback child (%s): no mapping holds the block\n", mode);
        return 1;
    }
    bool backed = strcmp(mode, "backed") == 0;
    if (strncmp(perms, backed ? "rw" : "--", 2) != 0) {
        fprintf(stderr, "fallback child (%s): the segment's mapping is %s\n", mode, perms);
        return 1;
    }
    if (backed) {
        memset(p, 0xa5, MiB);
        for (size_t i = 0; i < MiB; i += 4099)
            if (p[i] != 0xa5) {
                fprintf(stderr, "fallback child (backed): byte %zu reads %u\n", i, p[i]);
                return 1;
            }
    }
    tally_free(p);
    return 0;
}

static void test_segments_outside_the_arena_keep_the_mode(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* Their runtimes reserve terabytes of shadow addresses at start, over
     * any address-space limit the child could set (make asan, make tsan). */
    SKIP("ASan's and TSan's shadow memory does not start under an address-space limit");
#endif
    static const char *const modes[] = {"backed", "virtual"};
    for (int i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "/proc/%d/exe --fallback-child %s", (int)getpid(), modes[i]);
        int st = system(cmd);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("host_mode:%s, arena out of reach: the child failed (status %d)", modes[i], st);
    }
}

/* A search that never ends would hang the suite: fail it instead. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_backend_host: timed out (a lookup that never ends?)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--fallback-child") == 0)
        return fallback_child(argv[2]);
    tu_conf("backend:host,host_devices:2,host_mode:virtual,host_capacity:256MiB,expandable_segments:true,"
            "expandable_grow_chunk_mb:2,expandable_move_budget:-1,leak_report:off");
    signal(SIGALRM, on_alarm);
    alarm(60);
    assert_int_equal(tally_init(), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unmap_counts_each_handle_it_takes_down_once),
        cmocka_unit_test(test_empty_cache_releases_the_handles_the_segment_mapped),
        cmocka_unit_test(test_freed_segment_among_live_ones_is_reused),
        cmocka_unit_test(test_segments_outside_the_arena_keep_the_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
