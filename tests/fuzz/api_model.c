/* fuzz_api's model (tests/fuzz/fuzz_api.h): the blocks, tags and stages it
 * expects, the sink that counts the library's lines, how a violation is
 * reported, the checks after each call, and the clean-up that undoes an
 * input and checks that every device is empty. */
#include "fuzz_api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct model M;
long last_check; /* the call after which tally_check() last ran */

/* ---- the sink: counts lines; keeps the text of the current operation ---- */

struct sink S;

void sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    for (size_t i = 0; i < len; i++)
        S.lines += text[i] == '\n';
    size_t room = sizeof S.text - 1 - S.len;
    if (len > room)
        len = room;
    memcpy(S.text + S.len, text, len);
    S.len += len;
    S.text[S.len] = 0;
}

void sink_clear(void)
{
    S.len = 0;
    S.text[0] = 0;
}

/* ---- failing ------------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) void violated(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz_api: op %ld (opcode %d): ", M.op, M.opcode);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  last error: %s\n  sink (this operation): %.2000s\n", tally_last_error(), S.text);
    abort();
}

void say(const char *fmt, ...)
{
    if (!trace)
        return;
    va_list ap;
    fprintf(stderr, "op %ld: ", M.op);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- model helpers --------------------------------------------------------- */

int live_find(const void *p)
{
    for (int i = 0; i < M.nlive; i++)
        if (M.live[i].p == p)
            return i;
    return -1;
}

void forget_freed(const void *p)
{
    for (int i = 0; i < M.nfreed;) {
        if (M.freed[i].p == p)
            M.freed[i] = M.freed[--M.nfreed];
        else
            i++;
    }
}

void model_free(int i)
{
    void *p = M.live[i].p;
    int dev = M.live[i].dev;
    M.live[i] = M.live[--M.nlive];
    forget_freed(p);
    int slot = M.nfreed == MAXFREED ? rand() % MAXFREED : M.nfreed++;
    M.freed[slot].p = p;
    M.freed[slot].dev = dev;
    M.freed[slot].seq = M.frees[dev]++;
}

tally_stats_t stats(int dev)
{
    tally_stats_t s;
    RC(tally_get_stats(dev, &s), 0);
    return s;
}

int64_t live_on(int dev)
{
    int64_t n = 0;
    for (int i = 0; i < M.nlive; i++)
        n += M.live[i].dev == dev;
    return n;
}

const char *top_tag(void)
{
    return M.ntags ? M.tags[M.ntags - 1] : "untagged";
}

const char *top_stage(void)
{
    return M.nstages ? M.stages[M.nstages - 1] : "(none)";
}

void expect_info(const live_t *l, bool check_names, const char *tag, const char *stage)
{
    tally_block_info_t info;
    RC(tally_block_info(l->p, &info), 0);
    REQUIRE(info.device == l->dev, "block %p: device %d, expected %d", l->p, info.device, l->dev);
    REQUIRE(info.requested_size == l->req, "block %p: requested %zu, expected %zu", l->p, info.requested_size, l->req);
    REQUIRE(info.size == l->size, "block %p: size %zu, was %zu", l->p, info.size, l->size);
    REQUIRE(info.stream == l->stream, "block %p: stream %p, expected %p", l->p, info.stream, l->stream);
    if (check_names) {
        REQUIRE(strcmp(tally_tag_name(info.tag), tag) == 0, "block %p: tag '%s', expected '%s'", l->p,
                tally_tag_name(info.tag), tag);
        REQUIRE(strcmp(tally_stage_name(info.stage), stage) == 0, "block %p: stage '%s', expected '%s'", l->p,
                tally_stage_name(info.stage), stage);
    }
}

void check_all(bool full, bool every_block)
{
    if (full) {
        if (tally_check() != 0)
            violated("tally_check (last clean after op %ld): %s", last_check, tally_last_error());
        last_check = M.op;
    }
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = stats(d);
        REQUIRE(s.allocation[0].current == live_on(d), "device %d: allocation.all.current %lld, model has %lld", d,
                (long long)s.allocation[0].current, (long long)live_on(d));
        REQUIRE(s.reserved_bytes[0].current <= (int64_t)CAPACITY, "device %d: reserved %lld over capacity", d,
                (long long)s.reserved_bytes[0].current);
    }
    if (every_block)
        for (int i = 0; i < M.nlive; i++)
            expect_info(&M.live[i], false, NULL, NULL);
}


snapshot_t snap(void)
{
    snapshot_t x;
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = stats(d);
        x.alloc[d] = s.allocation[0].current;
        x.active[d] = s.active[0].current;
        x.reserved[d] = s.reserved_bytes[0].current;
        x.ooms[d] = s.num_ooms;
    }
    return x;
}

void expect_unchanged(const snapshot_t *a, const char *what)
{
    snapshot_t b = snap();
    for (int d = 0; d < NDEV; d++)
        REQUIRE(a->alloc[d] == b.alloc[d] && a->active[d] == b.active[d] && a->reserved[d] == b.reserved[d],
                "%s changed device %d: allocations %lld -> %lld, active %lld -> %lld, reserved %lld -> %lld", what,
                d, (long long)a->alloc[d], (long long)b.alloc[d], (long long)a->active[d], (long long)b.active[d],
                (long long)a->reserved[d], (long long)b.reserved[d]);
}

/* A call that must fail with code and one new sink line naming fn. */
void expect_reported(int rc, int code, long lines_before, const char *fn)
{
    REQUIRE(rc == -code, "%s returned %d, expected %d", fn, rc, -code);
    REQUIRE(S.lines == lines_before + 1, "%s: %ld sink lines, expected 1", fn, S.lines - lines_before);
    REQUIRE(strstr(S.text, fn) != NULL, "%s: the sink line does not name it", fn);
}

/* ---- undo everything ---------------------------------------------------- */

void cleanup(void)
{
    M.opcode = -1;
    sink_clear();
    RC(tally_host_fail_alloc(0, 0), 0);
    while (M.nlive) {
        tally_free(M.live[M.nlive - 1].p);
        model_free(M.nlive - 1);
    }
    while (M.ntags) {
        RC(tally_tag_pop(), 0);
        M.ntags--;
    }
    RC(tally_tag_pop(), -TALLY_ESTATE);
    while (M.nstages) {
        RC(tally_stage_end(M.stages[M.nstages - 1]), 0);
        M.nstages--;
    }
    for (int h = 0; h < NHOLD; h++)
        RC(tally_host_stream_hold(streams[2 + h], 0), 0);
    RC(tally_configure(restore_conf), 0);
    for (int d = 0; d < NDEV; d++)
        RC(tally_set_memory_fraction(1.0, d), 0);
    tally_empty_cache(-1);
    check_all(true, false);
    for (int d = 0; d < NDEV; d++) {
        tally_stats_t s = stats(d);
        REQUIRE(s.allocation[0].current == 0 && s.active[0].current == 0 && s.reserved_bytes[0].current == 0 &&
                    s.segment[0].current == 0 && s.inactive_split[0].current == 0,
                "device %d not empty after freeing everything: %lld allocations, %lld active, %lld bytes reserved", d,
                (long long)s.allocation[0].current, (long long)s.active[0].current,
                (long long)s.reserved_bytes[0].current);
        size_t fr = 0, total = 0;
        RC(tally_mem_get_info(d, &fr, &total), 0);
        REQUIRE(fr == total, "device %d: the backend has %zu of %zu bytes free after everything went back", d, fr,
                total);
        /* Since the process began: every allocation freed, every range
         * unreserved, every page mapped unmapped (free memory alone misses
         * a range left reserved with nothing mapped). */
        tally_host_calls_t c;
        RC(tally_host_calls(d, &c), 0);
        REQUIRE(c.alloc == c.free && c.reserve == c.unreserve && c.map_pages == c.unmap_pages,
                "device %d: the backend's calls do not balance after everything went back: %llu allocs, %llu frees, "
                "%llu reserves, %llu unreserves, %llu pages mapped, %llu unmapped",
                d, (unsigned long long)c.alloc, (unsigned long long)c.free, (unsigned long long)c.reserve,
                (unsigned long long)c.unreserve, (unsigned long long)c.map_pages, (unsigned long long)c.unmap_pages);
    }
}
