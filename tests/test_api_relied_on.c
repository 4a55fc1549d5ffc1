/* Behaviours users rely on that no other test pinned down (issue 25: a set
 * of mutations written without sight of the tests survived here). One test
 * per behaviour, named for it; each runs in a forked child under its own
 * TALLY_CONF (the configuration is read once per process, and CUDA must not
 * be initialised before a fork). The cuda-backend tests run against the
 * CUDA stand-in (build/standin/libcuda.so.1 through LD_LIBRARY_PATH, as
 * `make test` sets it; docs/standin.md), which gets three devices here.
 *
 *   graph pool ids (0, 1), (0, 2) are two pools   test_graph_pools_differing_only_in_second_id_half_share_nothing
 *   NULL stream on two devices is two uses         test_null_stream_on_two_devices_is_two_uses
 *   a block freed in a capture comes back after    test_block_freed_in_capture_returns_when_every_deferred_record_fails
 *   ignored and leaked blocks stay apart           test_leak_groups_keep_ignored_apart_from_leaked_at_one_site
 *   the ledger table's peak column                 test_ledger_table_peak_column_shows_the_peak
 *
 * Survivors of blind samples (make mutate, docs/testing.md):
 *   host_alloc's unlock after a refused mmap       test_host_device_usable_after_the_kernel_refuses_a_mapping
 *   host_map's unlock after a refused mprotect     test_host_device_usable_after_the_kernel_refuses_to_map_pages
 *   a size option of 0 accepted                    test_size_option_of_zero_is_refused
 *   a symbol name cut at '@' with a stray byte     test_leak_report_frames_are_plain_text
 *   a frame's module written as its file           the same test
 *   U+10FFFF refused in a name                     test_names_accept_utf8_up_to_the_last_code_point
 *   cached_free_bytes from allocated, not reserved test_cached_free_bytes_is_reserved_less_active
 *   a use with no event not waited for             test_use_whose_event_cannot_be_had_is_waited_for_on_its_stream
 *   a released backed segment's pages kept          test_host_backed_segment_released_goes_back_to_the_kernel */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h" /* tally__backend_host */
#include "core/internal.h"   /* tally__meta_fail */
#include "cudachild.h"
#include "sleeputil.h" /* su_faults */
#include "tally.h"

#define MiB ((size_t)1 << 20)

static void push_device(int dev)
{
    CUdevice d;
    CUcontext ctx;
    CU_EXPECT(cu.cuDeviceGet(&d, dev));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&ctx, d));
    CU_EXPECT(cu.cuCtxPushCurrent(ctx));
}

static void pop_device(void)
{
    CUcontext popped;
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
}

/* Let a hold on dev's NULL stream go, and wait until dev's work is done. */
static void release_and_drain(struct cu_hold *h, int dev)
{
    cu_release(h);
    push_device(dev);
    CU_EXPECT(cu.cuCtxSynchronize());
    pop_device();
}

typedef struct {
    char text[16384];
    size_t len;
} buf_t;

static void buf_write(void *arg, const char *text, size_t len)
{
    buf_t *b = arg;
    if (len > sizeof b->text - 1 - b->len)
        len = sizeof b->text - 1 - b->len;
    memcpy(b->text + b->len, text, len);
    b->len += len;
    b->text[b->len] = '\0';
}

/* ---- 1. graph pool identity ------------------------------------------------- */

/* PyTorch's graph_pool_handle() ids are (0, 1), (0, 2), ...: a pool is both
 * halves of its id, so a graph in (0, 2) never gets memory that graph
 * (0, 1) keeps for its replays, and releasing (0, 1) leaves (0, 2) alone. */
static void body_graph_pool_ids(void)
{
    EXPECT(tally_init() == 0);
    EXPECT(tally_graph_pool_begin(0, 0, 1, NULL, NULL) == 0);
    void *g1 = tally_malloc(MiB, 0, NULL);
    EXPECT(g1 != NULL);
    tally_free(g1); /* cached in pool (0, 1) for its replays */
    EXPECT(tally_graph_pool_end(0, 0, 1) == 0);

    EXPECT(tally_graph_pool_begin(0, 0, 2, NULL, NULL) == 0);
    void *g2 = tally_malloc(MiB, 0, NULL);
    EXPECT(g2 != NULL);
    EXPECT(g2 != g1); /* (0, 2) is another graph */
    EXPECT(tally_graph_pool_end(0, 0, 2) == 0);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.segment[0].current == 2); /* one segment per pool */

    /* Releasing (0, 1) returns its segment only: g2's stays. */
    EXPECT(tally_graph_pool_release(0, 0, 1) == 0);
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.segment[0].current == 1);
    EXPECT(tally_graph_pool_release(0, 0, 2) == 0);
    EXPECT(tally_graph_pool_release(0, 0, 2) == -TALLY_EINVAL); /* gone */
    tally_free(g2);
    EXPECT(tally_empty_cache(0) == 2 * MiB);
    EXPECT(tally_check() == 0);
}

static void test_graph_pools_differing_only_in_second_id_half_share_nothing(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,leak_report:off", body_graph_pool_ids);
}

/* A graph pool being filled takes the small requests routed to it, even
 * when the device's own pool has a cached block that fits (the small fast
 * path serves only the device's pool): memory kept for a graph's replays
 * and eager memory never mix. */
static void body_graph_pool_never_takes_eager_cache(void)
{
    EXPECT(tally_init() == 0);
    void *eager = tally_malloc(4096, 0, NULL);
    EXPECT(eager != NULL);
    tally_free(eager); /* cached in the device's small pool */
    EXPECT(tally_graph_pool_begin(0, 0, 1, NULL, NULL) == 0);
    void *g = tally_malloc(1024, 0, NULL);
    EXPECT(g != NULL);
    EXPECT(g != eager);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.segment[TALLY_POOL_SMALL].current == 2); /* the graph pool's own segment */
    EXPECT(tally_graph_pool_end(0, 0, 1) == 0);
    void *after = tally_malloc(1024, 0, NULL); /* eager again: the device's cached block */
    EXPECT(after == eager);
    tally_free(after);
    tally_free(g);
    EXPECT(tally_graph_pool_release(0, 0, 1) == 0);
    EXPECT(tally_check() == 0);
}

static void test_graph_pool_being_filled_never_takes_the_devices_cached_blocks(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,leak_report:off", body_graph_pool_never_takes_eager_cache);
}

/* With the ledger off (ledger:false) blocks carry no ledger row: tagged
 * allocations and their frees keep the statistics, and tally_check passes
 * (a free must not touch a row the block never had). */
static void body_ledger_off(void)
{
    EXPECT(tally_init() == 0);
    EXPECT(tally_tag_push("off-tag") == 0);
    void *p[6];
    for (int i = 0; i < 6; i++)
        EXPECT((p[i] = tally_malloc(i % 2 ? 30 * MiB : 4096u << i, 0, NULL)) != NULL);
    EXPECT(tally_check() == 0);
    for (int i = 0; i < 6; i++)
        tally_free(p[i]);
    EXPECT(tally_tag_pop() == 0);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.allocation[TALLY_POOL_ALL].current == 0);
    EXPECT(st.allocation[TALLY_POOL_ALL].allocated == 6);
    EXPECT(tally_check() == 0);
}

static void test_ledger_off_allocations_and_frees_keep_the_statistics(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,leak_report:off,ledger:false", body_ledger_off);
}

/* ---- 2. the NULL stream of two devices -------------------------------------- */

/* NULL is each device's default stream: a block used on device 1's NULL
 * stream and then on device 2's has two uses, and its memory comes back only
 * once both devices' work is done. */
static void body_null_stream_two_devices(void)
{
    driver_up();
    void *p = tally_malloc(MiB, 0, NULL);
    EXPECT(p != NULL);
    push_device(1);
    struct cu_hold *h1 = cu_hold(NULL);
    EXPECT(h1 != NULL);
    EXPECT(tally_record_stream(p, NULL) == 0);
    pop_device();
    push_device(2);
    struct cu_hold *h2 = cu_hold(NULL);
    EXPECT(h2 != NULL);
    EXPECT(tally_record_stream(p, NULL) == 0);
    pop_device();
    tally_free(p);

    /* Device 1 is done, device 2 still busy: p is not free yet. */
    release_and_drain(h1, 1);
    void *q = tally_malloc(MiB, 0, NULL);
    EXPECT(q != NULL);
    EXPECT(q != p);
    tally_free(q);

    /* Device 2 done too: p comes back. */
    release_and_drain(h2, 2);
    void *r = tally_malloc(MiB, 0, NULL);
    EXPECT(r == p || r == q);
    void *s = tally_malloc(MiB, 0, NULL);
    EXPECT(s == p || s == q);
    EXPECT(r != s);
    tally_free(r);
    tally_free(s);
    EXPECT(tally_check() == 0);
}

static void test_null_stream_on_two_devices_is_two_uses(void **state)
{
    (void)state;
    need_devices(3);
    in_child("backend:cuda,leak_report:off", body_null_stream_two_devices);
}

/* ---- 3. a block freed during a capture -------------------------------------- */

static int only_stream(void *arg, void *stream)
{
    return stream == arg;
}

/* A block freed while a capture is under way gets its events once the
 * capture has ended. When none of them can be recorded (here: both streams
 * it was used on are gone by then), tally waits for those streams instead,
 * and the block goes back to its pool: the next request of its size and
 * stream gets it. */
static void body_capture_deferred_records_fail(void)
{
    driver_up();
    CUstream s = make_stream(0), side = make_stream(0), u1 = make_stream(0), u2 = make_stream(0);
    void *x = tally_malloc(MiB, 0, side);
    EXPECT(x != NULL);
    EXPECT(tally_record_stream(x, u1) == 0);
    EXPECT(tally_record_stream(x, u2) == 0);
    EXPECT(tally_graph_pool_begin(0, 0, 1, only_stream, s) == 0);
    CU_EXPECT(cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    void *g = tally_malloc(2 * MiB, 0, s); /* tally sees the capture */
    EXPECT(g != NULL);
    tally_free(x); /* its events wait for the capture's end */
    tally_free(g);
    CUgraph graph = NULL;
    CU_EXPECT(cu.cuStreamEndCapture(s, &graph));
    CU_EXPECT(cu.cuGraphDestroy(graph));
    CU_EXPECT(cu.cuStreamDestroy(u1)); /* every deferred record will fail */
    CU_EXPECT(cu.cuStreamDestroy(u2));
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active[0].current == 1); /* x, still held back */
    /* The end of the announced capture is when the deferred events are
     * recorded (lib/cache/events.c, flush_deferred): here every one fails. */
    EXPECT(tally_graph_pool_end(0, 0, 1) == 0);
    void *y = tally_malloc(MiB, 0, side);
    EXPECT(y == x); /* x is back in its pool */
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active[0].current == 1); /* y only */
    tally_free(y);
    EXPECT(tally_graph_pool_release(0, 0, 1) == 0);
    EXPECT(tally_check() == 0);
    CU_EXPECT(cu.cuStreamSynchronize(side));
}

static void test_block_freed_in_capture_returns_when_every_deferred_record_fails(void **state)
{
    (void)state;
    need_devices(1);
    in_child("backend:cuda,leak_report:off", body_capture_deferred_records_fail);
}

/* ---- 4. leak groups ------------------------------------------------------------ */

static void *volatile kept[4];

/* One allocation site for every block: the one call below (the site is
 * the frame that calls tally_malloc; backtrace_depth:1 below). */
static __attribute__((noinline)) void *alloc_at_one_site(void)
{
    tally_tag_push("weights");
    void *p = tally_malloc(MiB, 0, NULL);
    tally_tag_pop();
    return p;
}

/* Two blocks of one tag, stage, device and allocation site, one passed to
 * tally_ignore: the report names one leaked block, and counts the other
 * apart as ignored. */
static void body_leak_groups(void)
{
    EXPECT(tally_stage_begin("load") == 0);
    kept[0] = alloc_at_one_site();
    kept[1] = alloc_at_one_site();
    EXPECT(kept[0] != NULL && kept[1] != NULL);
    EXPECT(tally_ignore(kept[0]) == 0);
    buf_t b = {{0}, 0};
    EXPECT(tally_write_leaks(TALLY_LEAKS_FULL | TALLY_LEAKS_AT_EXIT, buf_write, &b) == 0);
    if (!strstr(b.text, "tally: Direct leak of 1048576 bytes (1.0 MiB) in 1 block allocated from:\n") ||
        !strstr(b.text, "tally: ignored (tally_ignore): 1048576 bytes (1.0 MiB) in 1 block\n") ||
        !strstr(b.text, "tally: SUMMARY: 1048576 bytes leaked in 1 block (1 block suppressed)\n")) {
        fprintf(stderr, "leak report:\n%s", b.text);
        EXPECT(!"one leaked block and one ignored block, apart");
    }
    tally_free(kept[0]);
    tally_free(kept[1]);
    EXPECT(tally_stage_end("load") == 0);
}

static void test_leak_groups_keep_ignored_apart_from_leaked_at_one_site(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,backtrace_depth:1,leak_report:off,stage_report:false", body_leak_groups);
}

/* ---- 5. the ledger table's peak ------------------------------------------------ */

/* The ledger table's "peak" column is the row's peak, where it differs from
 * the current figure: 3 MiB and 1 MiB held together, then the 3 MiB freed. */
static void body_ledger_peak(void)
{
    EXPECT(tally_stage_begin("train") == 0);
    tally_tag_push("activations");
    void *a = tally_malloc(3 * MiB, 0, NULL);
    void *b = tally_malloc(MiB, 0, NULL);
    tally_tag_pop();
    EXPECT(a != NULL && b != NULL);
    tally_free(a);
    buf_t out = {{0}, 0};
    EXPECT(tally_write_ledger(buf_write, &out) == 0);
    char header[256], row[256];
    snprintf(header, sizeof header, "%-6s %-20s %-20s %12s %12s %10s", "device", "tag", "stage", "current", "peak",
             "blocks");
    snprintf(row, sizeof row, "%-6d %-20s %-20s %12s %12s %10d", 0, "activations", "train", "1.0 MiB", "4.0 MiB", 1);
    if (!strstr(out.text, header) || !strstr(out.text, row)) {
        fprintf(stderr, "ledger:\n%s\nwanted the row:\n%s\n", out.text, row);
        EXPECT(!"current 1.0 MiB, peak 4.0 MiB");
    }
    tally_free(b);
    EXPECT(tally_stage_end("train") == 0);
}

static void test_ledger_table_peak_column_shows_the_peak(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,leak_report:off,stage_report:false", body_ledger_peak);
}

/* ---- found by the blind sample ------------------------------------------------ */

/* The host backend: a mapping the kernel refuses (a request larger than the
 * address space, under a capacity that allows it) is an out-of-memory
 * failure that leaves the device usable: the next allocation succeeds. */
static void body_host_refused_mapping(void)
{
    void *huge = tally_malloc((size_t)200 << 40, 0, NULL);
    EXPECT(huge == NULL);
    EXPECT(strstr(tally_last_error(), "mmap") != NULL);
    void *p = tally_malloc(MiB, 0, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(tally_check() == 0);
}

static void test_host_device_usable_after_the_kernel_refuses_a_mapping(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,host_capacity:250TiB,leak_report:off", body_host_refused_mapping);
}

/* The host backend in backed mode: pages of a reserved range that the kernel
 * refuses to make usable (host_map's mprotect fails) are an out-of-memory
 * failure that leaves the device usable: the pages' charge against the
 * capacity is given back and the host lock released, so the next backend
 * call succeeds (a lock left held hangs it: the alarm fails the test).
 * mprotect is made to fail the way it fails in a process with too many
 * mappings: the child fills its map count up to vm.max_map_count (pages of
 * one filler range made alternately readable, each such change splitting
 * the range, until the kernel refuses a split), and then asks for a page in
 * the middle of a reserved range, which needs the range split in three. */
#define HOST_PAGE_SIZE (2 * MiB)
#define SMALL_PAGE 4096
#define NO_MAP_LIMIT 77 /* the child's status when the kernel refused no split for want of room */

static long max_map_count(void)
{
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    long n = -1;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1)
            n = -1;
        fclose(f);
    }
    return n;
}

static void on_host_lock_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "timed out: a host backend call after the refused mprotect hangs (its lock left held?)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static void body_host_refused_mprotect(long limit)
{
    signal(SIGALRM, on_host_lock_alarm);
    alarm(20);
    EXPECT(tally_init() == 0);
    const tally_backend_t *b = &tally__backend_host;
    char why[256] = "";
    void *base = NULL;
    EXPECT(b->reserve(0, 8 * HOST_PAGE_SIZE, &base, why, sizeof why) == 0);
    /* The filler: 2 * limit + 2 small pages, unreadable; every other page made readable splits it once more. */
    size_t npages = 2 * (size_t)limit + 2;
    char *fill = mmap(NULL, npages * SMALL_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    EXPECT(fill != MAP_FAILED);
    int err = 0;
    for (size_t i = 1; i + 1 < npages && !err; i += 2)
        if (mprotect(fill + i * SMALL_PAGE, SMALL_PAGE, PROT_READ) != 0)
            err = errno;
    /* At the limit now: nothing but the call under test until the filler goes. */
    char *middle = (char *)base + 3 * HOST_PAGE_SIZE;
    int rc = err == ENOMEM ? b->map(0, middle, HOST_PAGE_SIZE, HOST_PAGE_SIZE, why, sizeof why) : -1;
    /* The whole filler unreadable again first: that merges its pieces back into one mapping without a split, so
     * the map count is down before munmap, whose interceptor under a sanitizer may need mappings of its own. */
    EXPECT(mprotect(fill, npages * SMALL_PAGE, PROT_NONE) == 0);
    EXPECT(munmap(fill, npages * SMALL_PAGE) == 0);
    if (err != ENOMEM)
        _exit(NO_MAP_LIMIT);
    EXPECT(rc == TALLY_ENOMEM);
    EXPECT(strstr(why, "mprotect of 2097152 bytes failed") != NULL);
    /* The whole capacity (8 pages, the refused one among them) maps and is usable. */
    EXPECT(b->map(0, base, 8 * HOST_PAGE_SIZE, HOST_PAGE_SIZE, why, sizeof why) == 0);
    memset(base, 0x5a, 8 * HOST_PAGE_SIZE);
    EXPECT(b->unmap(0, base, 8 * HOST_PAGE_SIZE) == 0);
    EXPECT(b->unreserve(0, base, 8 * HOST_PAGE_SIZE) == 0);
    void *p = tally_malloc(MiB, 0, NULL);
    EXPECT(p != NULL);
    tally_free(p);
    EXPECT(tally_check() == 0);
}

static void test_host_device_usable_after_the_kernel_refuses_to_map_pages(void **state)
{
    (void)state;
    long limit = max_map_count();
    if (limit <= 0 || limit > (1L << 20))
        SKIP("vm.max_map_count is %ld: filling the map count takes too long (or cannot be read)", limit);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_die_with_parent(parent);
        child_env("backend:host,host_devices:1,host_mode:backed,host_capacity:16MiB,leak_report:off");
        body_host_refused_mprotect(limit);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == NO_MAP_LIMIT)
        SKIP("the kernel made every split of the filler (vm.max_map_count %ld): no limit on mappings to run into",
             limit);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child ended with status %d (signal %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* A size option of 0 is refused (every size key wants a size > 0,
 * docs/configuration.md), naming the key and the value. */
static void body_zero_size_refused(void)
{
    EXPECT(tally_init() == -TALLY_ECONF);
    EXPECT(strstr(tally_last_error(), "host_capacity: '0' is not a size") != NULL);
}

static void test_size_option_of_zero_is_refused(void **state)
{
    (void)state;
    in_child("backend:host,host_capacity:0", body_zero_size_refused);
}

/* Every frame of a leak report is plain text, and those named from the
 * symbol table alone (no line information) say the name and the module:
 * "NAME+0xOFF (MODULE+0xOFF)". */
static void body_frames_plain_text(void)
{
    kept[0] = alloc_at_one_site();
    EXPECT(kept[0] != NULL);
    buf_t b = {{0}, 0};
    EXPECT(tally_write_leaks(TALLY_LEAKS_FULL, buf_write, &b) == 0);
    tally_free(kept[0]);
    for (const char *c = b.text; *c; c++)
        if ((unsigned char)*c < 0x20 && *c != '\n') {
            fprintf(stderr, "leak report:\n%s", b.text);
            EXPECT(!"a control character in the leak report");
        }
    /* At least one frame (libcmocka's, _start) is "NAME+0xOFF (MODULE+0xOFF)". */
    int named = 0;
    for (const char *at = strstr(b.text, " in "); at && !named; at = strstr(at + 1, " in ")) {
        char func[256], module[256];
        unsigned long long off, moff;
        named = sscanf(at, " in %255[^ +?]+0x%llx (%255[^ +]+0x%llx)", func, &off, module, &moff) == 4;
    }
    if (!named) {
        fprintf(stderr, "leak report:\n%s", b.text);
        EXPECT(!"no frame named from the symbol table alone (NAME+0xOFF (MODULE+0xOFF))");
    }
}

static void test_leak_report_frames_are_plain_text(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,backtrace_depth:16,leak_report:off", body_frames_plain_text);
}

/* Names are valid UTF-8 up to U+10FFFF, the last code point, included; one
 * past it is refused. */
static void body_names_up_to_the_last_code_point(void)
{
    EXPECT(tally_tag_push("plane16-\xf4\x8f\xbf\xbf") == 0); /* U+10FFFF */
    tally_tag_pop();
    EXPECT(tally_tag_push("past-\xf4\x90\x80\x80") == -TALLY_EINVAL); /* U+110000 */
    EXPECT(strstr(tally_last_error(), "UTF-8") != NULL);
}

static void test_names_accept_utf8_up_to_the_last_code_point(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,leak_report:off", body_names_up_to_the_last_code_point);
}

/* cached_free_bytes is what the cache holds unallocated: reserved less
 * active (a freed block's segment stays reserved). */
static void body_cached_free_bytes(void)
{
    void *keep = tally_malloc(MiB, 0, NULL);
    void *p = tally_malloc(3 * MiB, 0, NULL);
    EXPECT(keep != NULL && p != NULL);
    tally_free(p);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.reserved_bytes[0].current > st.active_bytes[0].current);
    EXPECT(st.cached_free_bytes == st.reserved_bytes[0].current - st.active_bytes[0].current);
    EXPECT(st.cached_free_bytes >= (int64_t)(3 * MiB));
    tally_free(keep);
}

static void test_cached_free_bytes_is_reserved_less_active(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,leak_report:off", body_cached_free_bytes);
}

/* ---- a use whose event cannot be had ----------------------------------------- */

struct releaser {
    struct cu_hold *hold;
    atomic_int released;
};

static void *release_later(void *arg)
{
    struct releaser *r = arg;
    usleep(300000);
    atomic_store(&r->released, 1);
    cu_release(r->hold);
    return NULL;
}

/* A block used on a busy stream is freed while no metadata can be had, so
 * no event can stand for that use: the free waits for the stream itself
 * (one stream synchronise, never the device's), and the memory is free at
 * once after it (lib/cache/events.c, sync_use). */
static void body_use_without_event(void)
{
    driver_up();
    CUstream s1 = make_stream(0);
    void *p = tally_malloc(MiB, 0, NULL);
    EXPECT(p != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    struct releaser r = {cu_hold(s1), 0};
    EXPECT(r.hold != NULL);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, release_later, &r) == 0);
    long long syncs = cu_calls("cuStreamSynchronize"), device_syncs = cu_calls("cuCtxSynchronize");
    tally__meta_fail(1, 1);
    tally_free(p);
    tally__meta_fail(0, 0);
    EXPECT(atomic_load(&r.released)); /* the free waited for s1's work */
    EXPECT(pthread_join(t, NULL) == 0);
    if (syncs >= 0) { /* the stand-in counts calls; a real driver does not */
        EXPECT(cu_calls("cuStreamSynchronize") - syncs == 1);
        EXPECT(cu_calls("cuCtxSynchronize") == device_syncs);
    }
    void *q = tally_malloc(MiB, 0, NULL);
    EXPECT(q == p);
    tally_free(q);
    EXPECT(tally_check() == 0);
    CU_EXPECT(cu.cuStreamDestroy(s1));
}

static void test_use_whose_event_cannot_be_had_is_waited_for_on_its_stream(void **state)
{
    (void)state;
    need_devices(1);
    in_child("backend:cuda,leak_report:off", body_use_without_event);
}

/* The host backend in backed mode gives a released segment's pages back to
 * the kernel (MADV_DONTNEED) and makes its range inaccessible until it is
 * handed out again: a use after empty_cache faults, as it must not quietly
 * read what was there, and the next segment at that address (the arena's
 * lowest free one) starts from fresh, zeroed pages, not the old bytes. */
static void body_host_backed_release(void)
{
    EXPECT(tally_init() == 0);
    const size_t n = 8 * MiB;
    unsigned char *p = tally_malloc(n, 0, NULL);
    EXPECT(p != NULL);
    memset(p, 0xab, n);
    EXPECT(!su_faults(p) && !su_faults(p + n - 1));
    tally_free(p);
    EXPECT(tally_empty_cache(0) == 20 * MiB); /* its 20 MiB segment went back */
    EXPECT(su_faults(p) && su_faults(p + n - 1));
    unsigned char *q = tally_malloc(n, 0, NULL);
    EXPECT(q == p);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i += 4096)
        nonzero += q[i] != 0 || q[i + 4095] != 0;
    EXPECT(nonzero == 0);
    tally_free(q);
    EXPECT(tally_check() == 0);
}

static void test_host_backed_segment_released_goes_back_to_the_kernel(void **state)
{
    (void)state;
    in_child("backend:host,host_devices:1,host_mode:backed,host_capacity:1GiB,leak_report:off",
             body_host_backed_release);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_pools_differing_only_in_second_id_half_share_nothing),
        cmocka_unit_test(test_graph_pool_being_filled_never_takes_the_devices_cached_blocks),
        cmocka_unit_test(test_ledger_off_allocations_and_frees_keep_the_statistics),
        cmocka_unit_test(test_null_stream_on_two_devices_is_two_uses),
        cmocka_unit_test(test_block_freed_in_capture_returns_when_every_deferred_record_fails),
        cmocka_unit_test(test_leak_groups_keep_ignored_apart_from_leaked_at_one_site),
        cmocka_unit_test(test_ledger_table_peak_column_shows_the_peak),
        cmocka_unit_test(test_host_device_usable_after_the_kernel_refuses_a_mapping),
        cmocka_unit_test(test_host_device_usable_after_the_kernel_refuses_to_map_pages),
        cmocka_unit_test(test_size_option_of_zero_is_refused),
        cmocka_unit_test(test_leak_report_frames_are_plain_text),
        cmocka_unit_test(test_names_accept_utf8_up_to_the_last_code_point),
        cmocka_unit_test(test_cached_free_bytes_is_reserved_less_active),
        cmocka_unit_test(test_use_whose_event_cannot_be_had_is_waited_for_on_its_stream),
        cmocka_unit_test(test_host_backed_segment_released_goes_back_to_the_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
