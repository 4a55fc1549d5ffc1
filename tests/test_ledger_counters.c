/* The ownership ledger: its counters per (tag, stage, device) agree
 * with the cache statistics, under random work on one thread and on many.
 *
 * Two simulated 80 GiB devices in virtual mode (LU_LEDGER_CONF); every test
 * frees what it takes and leaves no tag pushed and no stage open. */
#include "ledgerutil.h"

#define MB LU_MiB

/* ---- counters against the cache statistics --------------------------------- */

typedef struct live {
    void *p;
    int device;
    int tag;   /* index into rw_tags */
    int stage; /* index into rw_stages */
    size_t size;
} live_t;

static const char *const rw_tags[] = {"rw-a", "rw-b", "rw-c", "untagged"};
static const char *const rw_stages[] = {"(none)", "rw-outer", "rw-mid", "rw-inner"};


static size_t random_size(void)
{
    switch (tu_rand() % 10) {
    case 0: case 1: case 2: case 3: case 4:
        return 1 + tu_rand() % (64 * LU_KiB);
    case 5: case 6:
        return 1 + tu_rand() % MB;
    case 7: case 8:
        return MB + 1 + tu_rand() % (12 * MB);
    default:
        return 10 * MB + tu_rand() % (60 * MB);
    }
}

/* Sums over the report's ledger rows and the per-device statistics agree. */
static void expect_ledger_matches_stats(const tally_json_t *root, int ndev)
{
    const tally_json_t *rows = lu_jarr(root, "ledger");
    for (int dev = 0; dev < ndev; dev++) {
        int64_t cur = 0, live = 0, alloc = 0, freed = 0, ablocks = 0;
        for (size_t i = 0; i < rows->len; i++) {
            const tally_json_t *r = &rows->items[i];
            if (lu_jint(r, "device") != dev)
                continue;
            int64_t c = lu_jint(r, "current_bytes");
            cur += c;
            live += lu_jint(r, "live_blocks");
            alloc += lu_jint(r, "allocated_bytes");
            freed += lu_jint(r, "freed_bytes");
            ablocks += lu_jint(r, "allocated_blocks");
            /* Each row is consistent in itself. */
            LU_EQ(lu_jint(r, "allocated_bytes") - lu_jint(r, "freed_bytes"), c);
            assert_true(lu_jint(r, "peak_bytes") >= c);
            assert_true(lu_jint(r, "peak_blocks") >= lu_jint(r, "live_blocks"));
            assert_true(lu_jint(r, "allocated_blocks") >= lu_jint(r, "live_blocks"));
            assert_true(c >= 0);
        }
        LU_EQ(cur, lu_jstat(root, dev, "allocated_bytes.all.current"));
        LU_EQ(live, lu_jstat(root, dev, "allocation.all.current"));
        LU_EQ(alloc, lu_jstat(root, dev, "allocated_bytes.all.allocated"));
        LU_EQ(freed, lu_jstat(root, dev, "allocated_bytes.all.freed"));
        LU_EQ(ablocks, lu_jstat(root, dev, "allocation.all.allocated"));
        /* And the report's statistics are the live ones. */
        tally_stats_t s = lu_stats(dev);
        LU_EQ(cur, s.allocated_bytes[0].current);
        LU_EQ(live, s.allocation[0].current);
    }
}

static void test_counters_agree_with_cache_statistics(void **state)
{
    (void)state;
    enum { MAXLIVE = 400 };
    long ops = 4000;
    live_t live[MAXLIVE];
    int nlive = 0, depth = 0, tag = 3, tagpushed = 0;
    lu_cap_begin();
    for (long op = 0; op < ops; op++) {
        uint64_t r = tu_rand() % 100;
        if (r < 3 && depth < 3) {
            LU_OK(tally_stage_begin(rw_stages[depth + 1]));
            depth++;
        } else if (r < 6 && depth > 0) {
            LU_OK(tally_stage_end(rw_stages[depth]));
            depth--;
        } else if (r < 10) {
            if (tagpushed)
                LU_OK(tally_tag_pop());
            tag = (int)(tu_rand() % 4);
            tagpushed = tag != 3;
            if (tagpushed)
                LU_OK(tally_tag_push(rw_tags[tag]));
        } else if (r < 58 && nlive < MAXLIVE) {
            size_t size = random_size();
            int dev = (int)(tu_rand() % 2);
            void *p = lu_malloc(size, dev);
            tally_block_info_t info = lu_info(p);
            live[nlive++] = (live_t){p, dev, tag, depth, info.size};
            LU_EQ(info.device, dev);
            LU_STREQ(tally_tag_name(info.tag), rw_tags[tag]);
            LU_STREQ(tally_stage_name(info.stage), rw_stages[depth]);
        } else if (nlive > 0) {
            int k = (int)(tu_rand() % (uint64_t)nlive);
            tally_free(live[k].p);
            live[k] = live[--nlive];
        }
    }
    if (tagpushed)
        LU_OK(tally_tag_pop());
    while (depth > 0)
        LU_OK(tally_stage_end(rw_stages[depth--]));
    lu_cap_end();
    LU_CHECK_OK();
    tally_json_t *root = lu_report_json("random.json");
    expect_ledger_matches_stats(root, 2);
    /* Every rw-* row holds exactly the blocks this test still has. */
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 4; s++)
            for (int dev = 0; dev < 2; dev++) {
                int64_t bytes = 0, blocks = 0;
                for (int i = 0; i < nlive; i++)
                    if (live[i].tag == t && live[i].stage == s && live[i].device == dev) {
                        bytes += (int64_t)live[i].size;
                        blocks++;
                    }
                const tally_json_t *row = lu_ledger_row(root, rw_tags[t], rw_stages[s], dev);
                if (!row) {
                    LU_EQ(bytes, 0);
                    continue;
                }
                LU_EQ(lu_jint(row, "current_bytes"), bytes);
                LU_EQ(lu_jint(row, "live_blocks"), blocks);
                LU_EQ(lu_jbool(row, "foreign"), 0);
            }
    tally__json_free(root);
    for (int i = 0; i < nlive; i++)
        tally_free(live[i].p);
    LU_CHECK_OK();
    root = lu_report_json("random-after.json");
    expect_ledger_matches_stats(root, 2);
    for (int t = 0; t < 3; t++)
        for (int dev = 0; dev < 2; dev++) {
            const tally_json_t *row = lu_ledger_row(root, rw_tags[t], NULL, dev);
            if (row)
                LU_EQ(lu_jint(row, "current_bytes"), 0);
        }
    tally__json_free(root);
}

typedef struct mt_worker {
    int id;
    char tag[32];
    uint64_t seed;
    int64_t live_bytes[2];
    int64_t live_blocks[2];
    int errors;
} mt_worker_t;

static void *mt_worker_main(void *arg)
{
    mt_worker_t *w = arg;
    enum { N = 64 };
    void *p[N] = {0};
    int dev[N] = {0};
    size_t size[N] = {0};
    if (tally_tag_push(w->tag) != 0)
        w->errors++;
    uint64_t x = w->seed;
    for (int op = 0; op < 3000; op++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int k = (int)(x % N);
        if (p[k]) {
            tally_free(p[k]);
            w->live_bytes[dev[k]] -= (int64_t)size[k];
            w->live_blocks[dev[k]]--;
            p[k] = NULL;
        } else {
            dev[k] = (int)((x >> 20) & 1);
            size_t want = (x >> 24) % 4 == 0 ? MB + (x >> 32) % (24 * MB) : 1 + (x >> 32) % (256 * LU_KiB);
            p[k] = tally_malloc(want, dev[k], NULL);
            tally_block_info_t info;
            if (!p[k] || tally_block_info(p[k], &info) != 0 || strcmp(tally_tag_name(info.tag), w->tag) != 0) {
                w->errors++;
                continue;
            }
            size[k] = info.size;
            w->live_bytes[dev[k]] += (int64_t)size[k];
            w->live_blocks[dev[k]]++;
        }
    }
    /* Keep half of what is live for the check; free the rest. */
    for (int k = 0; k < N; k += 2)
        if (p[k]) {
            tally_free(p[k]);
            w->live_bytes[dev[k]] -= (int64_t)size[k];
            w->live_blocks[dev[k]]--;
            p[k] = NULL;
        }
    if (tally_tag_pop() != 0)
        w->errors++;
    return NULL;
}

/* Threads with their own tags allocate and free on both devices while the
 * main thread begins and ends stages: per tag and device, the rows summed
 * over stages hold what each thread still has, and the sums agree with the
 * statistics. */
static void test_counters_agree_under_threads(void **state)
{
    (void)state;
    enum { W = 4 };
    mt_worker_t w[W];
    pthread_t th[W];
    lu_cap_begin();
    for (int i = 0; i < W; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].id = i;
        snprintf(w[i].tag, sizeof w[i].tag, "mt-tag-%d", i);
        w[i].seed = 0x1234567ull * (uint64_t)(i + 1) + 99;
        assert_int_equal(pthread_create(&th[i], NULL, mt_worker_main, &w[i]), 0);
    }
    for (int round = 0; round < 200; round++) {
        LU_OK(tally_stage_begin(round % 2 ? "mt-odd" : "mt-even"));
        LU_OK(tally_stage_begin("mt-nested"));
        LU_OK(tally_stage_end("mt-nested"));
        LU_OK(tally_stage_end(round % 2 ? "mt-odd" : "mt-even"));
    }
    for (int i = 0; i < W; i++)
        pthread_join(th[i], NULL);
    lu_cap_end();
    LU_CHECK_OK();
    tally_json_t *root = lu_report_json("threads.json");
    expect_ledger_matches_stats(root, 2);
    const tally_json_t *rows = lu_jarr(root, "ledger");
    for (int i = 0; i < W; i++) {
        LU_EQ(w[i].errors, 0);
        for (int dev = 0; dev < 2; dev++) {
            int64_t bytes = 0, blocks = 0;
            for (size_t r = 0; r < rows->len; r++)
                if (strcmp(lu_jstr(&rows->items[r], "tag"), w[i].tag) == 0 &&
                    lu_jint(&rows->items[r], "device") == dev) {
                    bytes += lu_jint(&rows->items[r], "current_bytes");
                    blocks += lu_jint(&rows->items[r], "live_blocks");
                }
            LU_EQ(bytes, w[i].live_bytes[dev]);
            LU_EQ(blocks, w[i].live_blocks[dev]);
        }
    }
    tally__json_free(root);
    lu_setup_clean(NULL); /* frees what the threads kept */
}

/* tally_check's recount of the ledger walks device 0's whole pointer map,
 * its last slot too: with one of a tag's blocks there, the rows and the
 * recount agree (a walk that stopped one short would count one block less
 * than the row holds and fail the check). */
static void test_check_recounts_a_block_in_the_maps_last_slot(void **state)
{
    (void)state;
    enum { MAX = 4096 };
    static void *p[MAX];
    LU_OK(tally_tag_push("ct-last"));
    size_t size = 0, n = lu_fill_to_last_slot(p, MAX, &size);
    LU_OK(tally_tag_pop());
    LU_CHECK_OK();
    tally_json_t *root = lu_report_json("lastslot.json");
    const tally_json_t *row = lu_ledger_row(root, "ct-last", NULL, 0);
    assert_non_null(row);
    LU_EQ(lu_jint(row, "current_bytes"), (int64_t)(n * size));
    LU_EQ(lu_jint(row, "live_blocks"), (int64_t)n);
    tally__json_free(root);
    lu_free_all(p, n);
    LU_CHECK_OK();
}

/* An allocation whose (tag, stage) row cannot be made (out of host memory
 * for the ledger's rows) counts in no row: not in the row its block record
 * held in an earlier life, which the fast path's records keep (a free piece
 * keeps its owner fields). Its free then takes nothing from that row, and
 * tally_check's recount agrees with the rows throughout. */
static void test_a_block_without_a_row_counts_in_none(void **state)
{
    (void)state;
    tally_ledger_dev_t *ld = tally__g.dev[0]->ledger;
    /* Rows up to the capacity, so that the next row looked up (a key other
     * than the allocation before's) must grow the table. */
    char name[32];
    for (int i = 0; i == 0 || ld->count < ld->cap; i++) {
        if (i)
            LU_OK(tally_tag_pop());
        snprintf(name, sizeof name, "nr-fill-%d", i);
        LU_OK(tally_tag_push(name));
        void *f = tally_malloc(512, 0, NULL);
        assert_non_null(f);
        tally_free(f);
    }
    /* Under the last row (the key of the allocation before: no look-up), a
     * block whose record the next allocation takes again. */
    void *x = tally_malloc(4096, 0, NULL);
    assert_non_null(x);
    LU_OK(tally_tag_pop());
    tally_free(x);
    uint32_t rows = ld->count;
    LU_EQ(rows, ld->cap);
    LU_OK(tally_tag_push("nr-new")); /* interned before memory runs out */
    tally__meta_fail(1, 1);
    void *q = tally_malloc(4096, 0, NULL);
    uint64_t hits = tally__meta_fail_hits();
    tally__meta_fail(0, 0);
    assert_non_null(q);
    assert_ptr_equal(q, x); /* the same record, handed out again */
    assert_true(hits > 0);
    LU_EQ(ld->count, rows); /* no row was made */
    LU_OK(tally_tag_pop());
    LU_CHECK_OK();
    tally_free(q);
    LU_CHECK_OK();
    tally_json_t *root = lu_report_json("norow.json");
    const tally_json_t *row = lu_ledger_row(root, name, NULL, 0);
    assert_non_null(row);
    LU_EQ(lu_jint(row, "current_bytes"), 0);
    LU_EQ(lu_jint(row, "live_blocks"), 0);
    tally__json_free(root);
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        LU_T(test_counters_agree_with_cache_statistics),
        LU_T(test_counters_agree_under_threads),
        LU_T(test_check_recounts_a_block_in_the_maps_last_slot),
        LU_T(test_a_block_without_a_row_counts_in_none),
    };
    return LU_LEDGER_RUN("ledger_counters", tests);
}
