/* fuzz_api's operations on blocks and the cache (tests/fuzz/fuzz_api.h):
 * malloc, free, free_checked, bad pointers, record_stream, stream holds,
 * empty_cache, memory fractions, statistics resets, injected backend
 * failures, block_info and mem_get_info, each checked against the model. */
#include "fuzz_api.h"

#include <math.h>
#include <string.h>

/* ---- operations ----------------------------------------------------------- */

void op_malloc(reader_t *r)
{
    int dev = read_device(r);
    size_t size = read_size(r);
    void *stream = read_alloc_stream(r);
    say("malloc(%zu, %d, %p)", size, dev, stream);
    bool refused = size == 0 || (ssize_t)size < 0 || dev < 0 || dev >= NDEV;
    snapshot_t before;
    int64_t ooms = 0;
    if (refused)
        before = snap();
    else
        ooms = stats(dev).num_ooms;
    long lines = S.lines;
    void *p = tally_malloc(size, dev, stream);
    if (size == 0) {
        REQUIRE(p == NULL, "malloc(0) returned %p", p);
        REQUIRE(S.lines == lines, "malloc(0) wrote to the sink");
        expect_unchanged(&before, "malloc(0)");
        return;
    }
    if (refused) {
        REQUIRE(p == NULL, "malloc(%zu, %d) of a bad argument returned %p", size, dev, p);
        expect_reported(-TALLY_EINVAL, TALLY_EINVAL, lines, "tally_malloc");
        expect_unchanged(&before, "a refused malloc");
        return;
    }
    if (!p) {
        /* The only way a valid request fails on the host backend; the
         * allocation counts are compared after every operation. */
        REQUIRE(strstr(tally_last_error(), "out of memory on device") != NULL,
                "malloc(%zu, %d) failed other than out of memory", size, dev);
        tally_stats_t s = stats(dev);
        REQUIRE(s.num_ooms == ooms + 1, "device %d: num_ooms %lld -> %lld after one OOM", dev, (long long)ooms,
                (long long)s.num_ooms);
        char want[80];
        snprintf(want, sizeof want, "tally: out of memory on device %d: asked %zu bytes", dev, size);
        REQUIRE(S.lines > lines && strstr(S.text, want), "OOM not reported on the sink (want '%s')", want);
        return;
    }
    REQUIRE((uintptr_t)p % 512 == 0, "malloc returned %p, not 512-byte aligned", p);
    REQUIRE(M.nlive < MAXLIVE, "model full");
    REQUIRE(S.lines == lines, "a successful malloc wrote to the sink");
    tally_block_info_t info;
    RC(tally_block_info(p, &info), 0);
    REQUIRE(info.size >= size, "block %p of %zu bytes for a request of %zu", p, info.size, size);
    for (int i = 0; i < M.nlive; i++) {
        const live_t *o = &M.live[i];
        REQUIRE((uintptr_t)p + info.size <= (uintptr_t)o->p || (uintptr_t)o->p + o->size <= (uintptr_t)p,
                "new block [%p, +%zu) overlaps live block [%p, +%zu)", p, info.size, o->p, o->size);
    }
    live_t *l = &M.live[M.nlive++];
    *l = (live_t){p, size, info.size, dev, stream};
    forget_freed(p);
    expect_info(l, true, top_tag(), top_stage());
}

void op_free(reader_t *r)
{
    unsigned how = u8(r), which = u8(r);
    if (!M.nlive)
        return;
    int i = (int)(which % (unsigned)M.nlive);
    live_t l = M.live[i];
    say("free(%p) how %u", l.p, how % 4);
    long lines = S.lines;
    switch (how % 4) {
    case 0:
    case 1:
        tally_free(l.p);
        REQUIRE(S.lines == lines, "a good free wrote to the sink");
        break;
    case 2:
        RC(tally_free_checked(l.p, l.req, l.dev), 0);
        break;
    default: { /* wrong size or device: refused with a report, freed anyway */
        bool wrong_dev = how & 4;
        int rc = tally_free_checked(l.p, wrong_dev ? l.req : l.req + 1, wrong_dev ? (l.dev + 1) % NDEV : l.dev);
        expect_reported(rc, TALLY_EINVAL, lines, "tally_free");
        break;
    }
    }
    model_free(i);
    tally_block_info_t info;
    REQUIRE(tally_block_info(l.p, &info) == -TALLY_EINVAL, "block_info of a freed block succeeded");
}

void op_bad_pointer(reader_t *r)
{
    unsigned kind = u8(r), which = u8(r), off = u8(r);
    void *p = NULL;
    const struct freed *fr = NULL;
    int stack_var;
    switch (kind % 5) {
    case 0: /* double free of a block freed earlier and not live again */
        if (!M.nfreed)
            return;
        fr = &M.freed[which % (unsigned)M.nfreed];
        p = fr->p;
        if (live_find(p) >= 0)
            return;
        break;
    case 1: /* interior pointer */
        if (!M.nlive)
            return;
        {
            const live_t *l = &M.live[which % (unsigned)M.nlive];
            if (l->size <= 512)
                return;
            size_t k = 1 + off % (l->size / 512 - 1);
            p = (char *)l->p + (kind & 0x80 ? k * 512 : k);
        }
        break;
    case 2:
        p = &stack_var;
        break;
    case 3:
        p = (void *)(uintptr_t)(0x1000 + 512 * (uintptr_t)off);
        break;
    default:
        p = NULL;
        break;
    }
    unsigned call = (kind >> 3) % 4;
    say("bad pointer %p kind %u call %u", p, kind % 5, call);
    snapshot_t before = snap();
    long lines = S.lines;
    if (!p) {
        tally_free(NULL);
        RC(tally_free_checked(NULL, 1, 0), 0);
        RC(tally_record_stream(NULL, streams[1]), -TALLY_EINVAL);
        REQUIRE(S.lines == lines + 1, "free(NULL) or record_stream(NULL): %ld lines", S.lines - lines);
        return;
    }
    switch (call) {
    case 0:
        tally_free(p);
        REQUIRE(S.lines == lines + 1, "bad free of %p: %ld sink lines, expected 1", p, S.lines - lines);
        REQUIRE(strstr(S.text, "tally_free"), "bad free not reported");
        break;
    case 1:
        expect_reported(tally_free_checked(p, 512, 0), TALLY_EINVAL, lines, "tally_free");
        break;
    case 2:
        expect_reported(tally_record_stream(p, streams[2]), TALLY_EINVAL, lines, "tally_record_stream");
        break;
    default: {
        tally_block_info_t info;
        RC(tally_block_info(p, &info), -TALLY_EINVAL);
        REQUIRE(S.lines == lines, "block_info wrote to the sink");
        break;
    }
    }
    /* The device remembers its last 1024 frees (TALLY_FREED_RING). */
    if (fr && call < 2 && M.frees[fr->dev] - fr->seq <= 1000)
        REQUIRE(strstr(S.text, "double free"), "a double free of %p is not called one", p);
    expect_unchanged(&before, "a bad pointer");
}

void op_record(reader_t *r)
{
    unsigned which = u8(r);
    void *s = read_stream(r);
    if (!M.nlive)
        return;
    live_t *l = &M.live[which % (unsigned)M.nlive];
    say("record_stream(%p, %p)", l->p, s);
    RC(tally_record_stream(l->p, s), 0);
}

void op_hold(reader_t *r)
{
    unsigned b = u8(r);
    int h = (int)(b % NHOLD);
    int on = (b >> 2) & 1;
    say("hold(%p, %d)", streams[2 + h], on);
    RC(tally_host_stream_hold(streams[2 + h], on), 0);
    M.held[h] = on;
}

void op_empty_cache(reader_t *r)
{
    int dev = read_device(r);
    say("empty_cache(%d)", dev);
    int64_t before[NDEV], total_before = 0, total_after = 0;
    for (int d = 0; d < NDEV; d++)
        total_before += before[d] = stats(d).reserved_bytes[0].current;
    long lines = S.lines;
    size_t released = tally_empty_cache(dev);
    for (int d = 0; d < NDEV; d++) {
        int64_t after = stats(d).reserved_bytes[0].current;
        total_after += after;
        if (dev != -1 && dev != d)
            REQUIRE(after == before[d], "empty_cache(%d) changed device %d", dev, d);
    }
    if (dev != -1 && (dev < 0 || dev >= NDEV)) {
        REQUIRE(released == 0, "empty_cache of a bad device released %zu", released);
        expect_reported(-TALLY_EINVAL, TALLY_EINVAL, lines, "tally_empty_cache");
    }
    REQUIRE((int64_t)released == total_before - total_after, "empty_cache says %zu released, reserved fell by %lld",
            released, (long long)(total_before - total_after));
}

void op_fraction(reader_t *r)
{
    static const double fractions[] = {0.0, 0.05, 0.25, 0.5, 0.9, 1.0, -0.1, 1.5, NAN, INFINITY, 1e-300, -0.0};
    unsigned b = u8(r);
    int dev = read_device(r);
    double f = fractions[b % (sizeof fractions / sizeof fractions[0])];
    say("set_memory_fraction(%g, %d)", f, dev);
    bool ok = f >= 0.0 && f <= 1.0 && dev >= 0 && dev < NDEV;
    long lines = S.lines;
    int rc = tally_set_memory_fraction(f, dev);
    if (ok)
        REQUIRE(rc == 0, "set_memory_fraction(%g, %d) returned %d", f, dev, rc);
    else
        expect_reported(rc, TALLY_EINVAL, lines, "tally_set_memory_fraction");
}

void op_resets(reader_t *r)
{
    unsigned b = u8(r);
    int dev = read_device(r);
    bool ok = dev >= 0 && dev < NDEV;
    say("reset %s(%d)", b & 1 ? "accumulated" : "peak", dev);
    int rc = b & 1 ? tally_reset_accumulated_stats(dev) : tally_reset_peak_stats(dev);
    REQUIRE(rc == (ok ? 0 : -TALLY_EINVAL), "reset(%d) returned %d", dev, rc);
    if (ok && !(b & 1)) {
        tally_stats_t s = stats(dev);
        REQUIRE(s.allocation[0].peak == s.allocation[0].current, "peak not reset");
    }
}

void op_fail_alloc(reader_t *r)
{
    unsigned b = u8(r);
    uint64_t nth = b % 8, every = (b >> 3) % 8;
    say("host_fail_alloc(%llu, %llu)", (unsigned long long)nth, (unsigned long long)every);
    RC(tally_host_fail_alloc(nth, every), 0);
}

void op_info(reader_t *r)
{
    unsigned b = u8(r);
    int dev = read_device(r);
    say("info %u (device %d)", b % 3, dev);
    switch (b % 3) {
    case 0:
        if (M.nlive)
            expect_info(&M.live[(b >> 2) % (unsigned)M.nlive], false, NULL, NULL);
        break;
    case 1: {
        size_t fr = 0, total = 0;
        bool ok = dev >= 0 && dev < NDEV;
        RC(tally_mem_get_info(dev, &fr, &total), ok ? 0 : -TALLY_EINVAL);
        if (ok)
            REQUIRE(total == CAPACITY && fr <= total, "mem_get_info(%d): free %zu of %zu", dev, fr, total);
        RC(tally_mem_get_info(0, NULL, &total), -TALLY_EINVAL);
        break;
    }
    default: {
        tally_block_info_t info;
        RC(tally_get_stats(0, NULL), -TALLY_EINVAL);
        RC(tally_block_info(NULL, &info), -TALLY_EINVAL);
        if (M.nlive)
            RC(tally_block_info(M.live[0].p, NULL), -TALLY_EINVAL);
        break;
    }
    }
}
