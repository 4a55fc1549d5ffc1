/* Shared helpers for the caching-core tests (test_cache_blocks,
 * test_cache_limits, test_api, test_core_options, test_core_options_max_split,
 * test_cache_random, test_api_threads, test_cache_events).
 *
 * - tu_conf(): set TALLY_CONF before the first tally call of the process.
 * - A capture sink that collects diagnostics lines into a buffer.
 * - A text buffer for tally_write_* callbacks.
 * - EQ / CHECK_OK: assertions that print signed values and tally's error.
 * - The documented rounding rules (notes §1, §6) recomputed independently,
 *   so tests compare the library against the spec rather than itself. */
#ifndef TALLY_TESTUTIL_H
#define TALLY_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "skip.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tally.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Streams are opaque non-NULL pointer values. */
#define STREAM(n) ((void *)(uintptr_t)(0x1000u + 0x10u * (unsigned)(n)))

/* A fixed-seed xorshift64 stream for randomised tests: the same sequence
 * on every run, so a failure repeats. Each test binary has its own. */
static uint64_t tu_rand_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t tu_rand(void)
{
    tu_rand_state ^= tu_rand_state << 13;
    tu_rand_state ^= tu_rand_state >> 7;
    tu_rand_state ^= tu_rand_state << 17;
    return tu_rand_state;
}

/* What a table-driven test is looking at (shown by EQ on failure). */
static char tu_context[160];
#define tu_ctx(...) snprintf(tu_context, sizeof tu_context, __VA_ARGS__)

/* a == b as signed 64-bit numbers, with both expressions in the message. */
#define EQ(a, b)                                                                                                   \
    do {                                                                                                           \
        long long eq_a_ = (long long)(a), eq_b_ = (long long)(b);                                                  \
        if (eq_a_ != eq_b_)                                                                                        \
            fail_msg("%s:%d: %s is %lld, expected %s = %lld%s%s", __FILE__, __LINE__, #a, eq_a_, #b, eq_b_,        \
                     tu_context[0] ? " -- " : "", tu_context);                                                     \
    } while (0)

/* tally_check() == 0, else fail with the violation. */
#define CHECK_OK()                                                                                                 \
    do {                                                                                                           \
        if (tally_check() != 0)                                                                                    \
            fail_msg("%s:%d: tally_check failed: %s", __FILE__, __LINE__, tally_last_error());                    \
    } while (0)

/* s contains sub (NULL-safe), else fail showing s. */
#define HAS(s, sub)                                                                                                \
    do {                                                                                                           \
        const char *has_s_ = (s);                                                                                  \
        if (!has_s_ || !strstr(has_s_, (sub)))                                                                     \
            fail_msg("%s:%d: expected \"%s\" in: %s", __FILE__, __LINE__, (sub), has_s_ ? has_s_ : "(null)");     \
    } while (0)

static inline void tu_conf(const char *conf)
{
    setenv("TALLY_CONF", conf, 1);
}

/* Run fn in a child process, before this process initialises tally (for
 * tests that need a configuration only initialisation reads); whether the
 * child failed (fn non-zero, a crash, or no child). */
static inline int tu_run_child(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0)
        _exit(fn() ? 1 : 0);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return 1;
    return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}

/* Repeat count scaled by TALLY_TEST_SCALE (a factor in (0, 1], default 1),
 * never below min. */
static inline long tu_scaled(long full, long min)
{
    const char *s = getenv("TALLY_TEST_SCALE");
    double f = s && *s ? atof(s) : 1.0;
    if (!(f > 0) || f > 1)
        f = 1.0;
    long n = (long)((double)full * f);
    return n < min ? min : n;
}

/* ---- text buffers ------------------------------------------------------ */

typedef struct tu_buf {
    char *p;
    size_t len, cap;
} tu_buf_t;

static inline void tu_buf_write(void *arg, const char *text, size_t len)
{
    tu_buf_t *b = arg;
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->len + len + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p)
            abort();
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, text, len);
    b->len += len;
    b->p[b->len] = 0;
}

static inline void tu_buf_clear(tu_buf_t *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = 0;
}

static inline void tu_buf_free(tu_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* The options as text (tally_write_options), malloc'd. */
static inline char *tu_options_text(void)
{
    tu_buf_t b = {0};
    if (tally_write_options(tu_buf_write, &b) != 0)
        fail_msg("tally_write_options failed: %s", tally_last_error());
    if (!b.p)
        tu_buf_write(&b, "", 0);
    return b.p;
}

/* ---- the capture sink --------------------------------------------------- */

typedef struct tu_capture {
    pthread_mutex_t lock;
    char text[1 << 16];
    size_t len;
    int lines;
} tu_capture_t;

static tu_capture_t tu_cap = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline void tu_capture_write(void *arg, const char *text, size_t len)
{
    tu_capture_t *c = arg;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < len; i++)
        c->lines += text[i] == '\n';
    size_t room = sizeof c->text - 1 - c->len;
    if (len > room)
        len = room;
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = 0;
    pthread_mutex_unlock(&c->lock);
}

/* Start capturing diagnostics (clears what was captured). */
static inline void cap_begin(void)
{
    pthread_mutex_lock(&tu_cap.lock);
    tu_cap.len = 0;
    tu_cap.lines = 0;
    tu_cap.text[0] = 0;
    pthread_mutex_unlock(&tu_cap.lock);
    tally_set_sink(tu_capture_write, &tu_cap);
}

/* Clear the captured text, keep capturing. */
static inline void cap_clear(void)
{
    cap_begin();
}

/* Stop capturing (back to stderr); the text stays readable. */
static inline void cap_end(void)
{
    tally_set_sink(NULL, NULL);
}

static inline const char *cap_text(void)
{
    return tu_cap.text;
}

static inline int cap_lines(void)
{
    return tu_cap.lines;
}

/* ---- statistics --------------------------------------------------------- */

static inline tally_stats_t tu_stats(int device)
{
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    if (tally_get_stats(device, &s) != 0)
        fail_msg("tally_get_stats(%d) failed: %s", device, tally_last_error());
    return s;
}

static inline tally_block_info_t tu_info(const void *p)
{
    tally_block_info_t i;
    memset(&i, 0, sizeof i);
    if (tally_block_info(p, &i) != 0)
        fail_msg("tally_block_info(%p) failed: %s", p, tally_last_error());
    return i;
}

/* The "current" fields that describe live memory, equal in a and b. */
static inline void tu_expect_same_usage(const tally_stats_t *a, const tally_stats_t *b)
{
    for (int p = 0; p < TALLY_POOL_COUNT; p++) {
        EQ(a->allocation[p].current, b->allocation[p].current);
        EQ(a->allocated_bytes[p].current, b->allocated_bytes[p].current);
        EQ(a->active[p].current, b->active[p].current);
        EQ(a->active_bytes[p].current, b->active_bytes[p].current);
        EQ(a->requested_bytes[p].current, b->requested_bytes[p].current);
    }
}

/* ---- the documented rounding rules (independent of lib/) ---------------- */

/* round_size(s) with a 16-slot divisions table (NULL: all 0). */
static inline size_t tu_round(size_t s, const unsigned *div)
{
    if (s < 512)
        return 512;
    int lg = 63 - __builtin_clzll((unsigned long long)s);
    int idx = lg - 20;
    if (idx < 0)
        idx = 0;
    if (idx > 15)
        idx = 15;
    unsigned d = div ? div[idx] : 0;
    if (d > 1 && s > (size_t)512 * d) {
        if ((s & (s - 1)) == 0)
            return s;
        size_t f = (size_t)1 << lg;
        int lgd = 31 - __builtin_clz(d);
        size_t step = f >> lgd;
        if (step == 0)
            return 2 * f;
        return (s + step - 1) / step * step;
    }
    return (s + 511) / 512 * 512;
}

/* get_allocation_size(rounded): the segment a new block needs. */
static inline size_t tu_segment(size_t rounded)
{
    if (rounded <= MiB)
        return 2 * MiB;
    if (rounded < 10 * MiB)
        return 20 * MiB;
    return (rounded + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
}

static inline int tu_pool(size_t rounded)
{
    return rounded <= MiB ? TALLY_POOL_SMALL : TALLY_POOL_LARGE;
}

/* ---- tracked allocations -------------------------------------------------
 * Tests allocate through tu_malloc / tu_free so that a test that fails
 * half-way leaves nothing behind: tu_reset() frees its leftovers and the
 * next test starts clean instead of failing too. */

#define TU_MAX_TRACKED 8192
static void *tu_tracked[TU_MAX_TRACKED];
static int tu_ntracked;

static inline void *tu_malloc(size_t size, int device, void *stream)
{
    void *p = tally_malloc(size, device, stream);
    if (p && tu_ntracked < TU_MAX_TRACKED)
        tu_tracked[tu_ntracked++] = p;
    return p;
}

static inline void tu_forget(void *p)
{
    for (int i = tu_ntracked - 1; i >= 0; i--) {
        if (tu_tracked[i] == p) {
            tu_tracked[i] = tu_tracked[--tu_ntracked];
            return;
        }
    }
}

static inline void tu_free(void *p)
{
    tu_forget(p);
    tally_free(p);
}

static inline int tu_free_checked(void *p, size_t size, int device)
{
    tu_forget(p);
    return tally_free_checked(p, size, device);
}

/* Empty every device's cache and require that nothing is live. */
static inline void tu_clean_all(void)
{
    tally_empty_cache(-1);
    int n = tally_device_count();
    for (int d = 0; d < n; d++) {
        tally_stats_t s = tu_stats(d);
        EQ(s.allocation[0].current, 0);
        EQ(s.active[0].current, 0);
        EQ(s.reserved_bytes[0].current, 0);
    }
}

/* Free the blocks; then empty_cache(0) releases exactly expect bytes. */
static inline void free_then_empty(void **blocks, size_t n, size_t expect)
{
    for (size_t i = 0; i < n; i++)
        tu_free(blocks[i]);
    EQ(tally_empty_cache(0), expect);
    CHECK_OK();
}

/* Undo whatever a previous (possibly failed) test left: free its tracked
 * blocks, cancel fault injection, lift memory fractions, release holds on
 * STREAM(0..31), empty the cache; then require a clean slate. */
static inline void tu_reset(void)
{
    tu_context[0] = 0;
    tally_set_sink(NULL, NULL);
    tally_host_fail_alloc(0, 0);
    for (int i = 0; i < 32; i++)
        tally_host_stream_hold(STREAM(i), 0);
    while (tu_ntracked)
        tally_free(tu_tracked[--tu_ntracked]);
    int n = tally_device_count();
    for (int d = 0; d < n; d++)
        tally_set_memory_fraction(1.0, d);
    tu_clean_all();
}

/* A cmocka setup: every test starts from tu_reset()'s clean slate. */
static inline int tu_setup_clean(void **state)
{
    (void)state;
    tu_reset();
    return 0;
}

#endif /* TALLY_TESTUTIL_H */
