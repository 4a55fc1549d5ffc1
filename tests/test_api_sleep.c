/* Private tags, sleep and wake on the host backend (docs/sleep.md): a
 * private tag's blocks live on pages of their own; sleep unmaps them and
 * keeps the addresses (the pages become inaccessible), wake maps them back
 * at the same addresses, and after an offload restores every byte; what
 * the reports say of sleeping bytes. Every refusal is one line and changes
 * nothing: those, and waking out of memory, are in test_api_sleep_errors.c.
 *
 * Two simulated 1 GiB devices in backed mode (contents are real), with kv
 * and weights private through the configuration (tests/sleephostutil.h). */
#include "sleephostutil.h"

static const char *BOTH[] = {"weights", "kv"};

/* ---- private placement ------------------------------------------------------------------ */

static void test_private_tags_get_pages_of_their_own(void **state)
{
    (void)state;
    LU_EQ(tally_tag_is_private("kv"), 1);
    LU_EQ(tally_tag_is_private("weights"), 1);
    LU_EQ(tally_tag_is_private("other"), 0);
    /* Small blocks: untagged and kv alternate; no kv block may share a
     * segment with an untagged one. */
    void *u[8], *k[8];
    for (int i = 0; i < 8; i++) {
        u[i] = lu_malloc(4096, 0);
        k[i] = tagged("kv", 4096, 0);
    }
    for (int i = 0; i < 8; i++) {
        size_t us = 0, ks = 0;
        char *ub = segment_of(u[i], &us), *kb = segment_of(k[i], &ks);
        for (int j = 0; j < 8; j++) {
            char *x = u[j];
            if (x >= kb && x < kb + ks)
                fail_msg("untagged block %p lies in kv's segment %p", u[j], (void *)kb);
        }
        assert_true((char *)k[i] < ub || (char *)k[i] >= ub + us);
    }
    /* Freed kv memory is not handed to another tag, nor another's to kv. */
    void *kbig = tagged("kv", 30 * MB, 0);
    tally_free(kbig);
    void *other = lu_malloc(30 * MB, 0);
    assert_ptr_not_equal(other, kbig);
    void *again = tagged("kv", 30 * MB, 0);
    assert_ptr_equal(again, kbig);
    tally_free(other);
    void *wbig = tagged("weights", 30 * MB, 0);
    assert_ptr_not_equal(wbig, other);
    tally_free(wbig);
    tally_free(again);
    lu_free_all(u, 8);
    lu_free_all(k, 8);
    LU_CHECK_OK();
}

static void test_set_private_at_run_time(void **state)
{
    (void)state;
    LU_EQ(tally_tag_is_private("late"), 0);
    LU_OK(tally_tag_set_private("late"));
    LU_EQ(tally_tag_is_private("late"), 1);
    LU_OK(tally_tag_set_private("late")); /* twice is fine */
    void *p = tagged("late", 1 * MB, 1);
    void *q = lu_malloc(1 * MB, 1);
    size_t ps = 0;
    char *pb = segment_of(p, &ps);
    assert_true((char *)q < pb || (char *)q >= pb + ps);
    LU_EQ(tally_tag_set_private("untagged"), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "cannot be private");
    tally_free(p);
    tally_free(q);
    LU_CHECK_OK();
}

/* ---- sleep and wake --------------------------------------------------------------------- */

static void test_discard_unmaps_and_wake_maps_back(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *a = tagged("kv", 40 * MB, 0), *b = tagged("kv", 4096, 0);
    memset(a, 0x5a, 40 * MB);
    int64_t held = reserved(0) - before;
    assert_true(held >= 42 * (int64_t)MB);
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    LU_EQ(reserved(0), before);
    tally_sleep_info_t i = info("kv", 0);
    LU_EQ(i.asleep, 1);
    LU_EQ(i.offloaded, 0);
    LU_EQ(i.sleeping_blocks, 2);
    LU_EQ(i.sleeping, 40 * MB + 4096);
    LU_EQ(i.unmapped, held);
    LU_EQ(i.offload, 0);
    LU_EQ(i.reserved, 0);
    assert_true(su_faults(a));
    assert_true(su_faults(b));
    LU_CHECK_OK();
    LU_OK(tally_wake(KV, 1));
    LU_EQ(reserved(0), before + held);
    assert_false(su_faults(a));
    /* Discarded: the pages came back empty. */
    assert_int_equal(((unsigned char *)a)[0], 0);
    assert_int_equal(((unsigned char *)a)[40 * MB - 1], 0);
    i = info("kv", 0);
    LU_EQ(i.asleep, 0);
    LU_EQ(i.sleeps, i.wakes);
    LU_EQ(i.reserved, held);
    /* The blocks are the same blocks, still live and usable. */
    LU_EQ(lu_info(a).size, 40 * MB);
    memset(a, 1, 40 * MB);
    tally_free(a);
    tally_free(b);
    LU_CHECK_OK();
}

static void test_offload_restores_every_byte(void **state)
{
    (void)state;
    void *w[3] = {tagged("weights", 24 * MB + 512, 0), tagged("weights", 3000, 0), tagged("weights", 64 * MB, 1)};
    size_t sz[3] = {24 * MB + 512, 3000, 64 * MB};
    for (int i = 0; i < 3; i++)
        su_fill(w[i], sz[i], (unsigned)i * 7 + 1);
    int64_t r0 = reserved(0), r1 = reserved(1);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    assert_true(reserved(0) < r0 && reserved(1) < r1);
    tally_sleep_info_t all = info("weights", -1);
    LU_EQ(all.asleep, 1);
    LU_EQ(all.offloaded, 1);
    LU_EQ(all.sleeping_blocks, 3);
    /* Offload holds the rounded live blocks, not the free rest. */
    LU_EQ(all.offload, (24 * MB + 512) + 3072 + 64 * MB);
    for (int i = 0; i < 3; i++)
        assert_true(su_faults(w[i]));
    LU_OK(tally_wake(W, 1));
    LU_EQ(reserved(0), r0);
    LU_EQ(reserved(1), r1);
    for (int i = 0; i < 3; i++)
        if (!su_same(w[i], sz[i], (unsigned)i * 7 + 1))
            fail_msg("block %d differs after wake", i);
    LU_EQ(info("weights", -1).offload, 0);
    lu_free_all(w, 3);
    LU_CHECK_OK();
}

static void test_several_tags_in_one_call(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *w = tagged("weights", 10 * MB, 0), *k = tagged("kv", 10 * MB, 0);
    su_fill(w, 10 * MB, 3);
    LU_OK(tally_sleep(BOTH, 2, TALLY_SLEEP_OFFLOAD | TALLY_SLEEP_SYNC_DEVICE));
    LU_EQ(reserved(0), before);
    LU_EQ(info("kv", 0).asleep, 1);
    LU_EQ(info("weights", 0).asleep, 1);
    LU_OK(tally_wake(BOTH, 2));
    assert_true(su_same(w, 10 * MB, 3));
    tally_free(w);
    tally_free(k);
    LU_CHECK_OK();
}

/* TALLY_SLEEP_SYNC_DEVICE waits for each whole device once per tag, and the
 * statistics say so: num_sync_all_streams grows by one on every device the
 * tag sleeps on (it sleeps on all, holding memory there or not), and by
 * nothing without the flag; a sleep maps nothing, so num_device_alloc stays. */
static void test_sleep_sync_device_counts_one_device_sync_per_device(void **state)
{
    (void)state;
    void *k = tagged("kv", 10 * MB, 0);
    tally_stats_t a0 = lu_stats(0), a1 = lu_stats(1);
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_SYNC_DEVICE));
    tally_stats_t b0 = lu_stats(0), b1 = lu_stats(1);
    LU_EQ(b0.num_sync_all_streams - a0.num_sync_all_streams, 1);
    LU_EQ(b1.num_sync_all_streams - a1.num_sync_all_streams, 1);
    LU_EQ(b0.num_device_alloc - a0.num_device_alloc, 0);
    LU_EQ(b1.num_device_alloc - a1.num_device_alloc, 0);
    LU_OK(tally_wake(KV, 1));
    a0 = lu_stats(0);
    a1 = lu_stats(1);
    LU_OK(tally_sleep(KV, 1, 0));
    b0 = lu_stats(0);
    b1 = lu_stats(1);
    LU_EQ(b0.num_sync_all_streams - a0.num_sync_all_streams, 0);
    LU_EQ(b1.num_sync_all_streams - a1.num_sync_all_streams, 0);
    LU_EQ(b0.num_device_alloc - a0.num_device_alloc, 0);
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

static void test_sleep_releases_free_segments(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *a = tagged("kv", 30 * MB, 0), *b = tagged("kv", 30 * MB, 0);
    tally_free(b); /* a whole free segment, cached */
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    LU_EQ(reserved(0), before);
    LU_OK(tally_wake(KV, 1));
    LU_EQ(reserved(0), before + 30 * (int64_t)MB); /* only a's segment came back */
    tally_free(a);
    LU_CHECK_OK();
}

/* A segment whose blocks are all freed while asleep needs no pages: empty_cache
 * gives its addresses back and counts no bytes (none were reserved), and a
 * wake does not map it. */
static void test_segments_freed_while_asleep(void **state)
{
    (void)state;
    int64_t before = reserved(0);
    void *a = tagged("kv", 30 * MB, 0), *b = tagged("kv", 30 * MB, 0), *c = tagged("kv", 30 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_EQ(reserved(0), before);
    tally_free(a);
    LU_EQ(tally_empty_cache(0), 0);
    LU_EQ(reserved(0), before);
    tally_free(b);
    LU_CHECK_OK();
    LU_OK(tally_wake(KV, 1));
    LU_EQ(reserved(0), before + 30 * (int64_t)MB); /* c's segment only */
    tally_free(c);
    LU_CHECK_OK();
}

/* ---- accounting ------------------------------------------------------------------------- */

static const tally_json_t *private_row(const tally_json_t *root, const char *tag, int device)
{
    const tally_json_t *rows = lu_jarr(root, "private_tags");
    for (size_t i = 0; i < rows->len; i++)
        if (strcmp(lu_jstr(&rows->items[i], "tag"), tag) == 0 && lu_jint(&rows->items[i], "device") == device)
            return &rows->items[i];
    fail_msg("no private_tags row for %s on device %d", tag, device);
    return NULL;
}

static void test_reports_show_sleeping_bytes(void **state)
{
    (void)state;
    LU_OK(tally_configure("timeline:true"));
    LU_OK(tally_stage_begin("rollout"));
    void *w = tagged("weights", 10 * MB, 0), *k = tagged("kv", 6 * MB, 0);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    /* The ledger: the private tags' table. */
    lu_buf_t b = {0};
    LU_OK(tally_write_ledger(lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "private tags (sleep and wake)");
    LU_HAS(lu_buf_str(&b), "asleep, offloaded");
    LU_HAS(lu_buf_str(&b), "asleep, discarded");
    LU_HAS(lu_buf_str(&b), "10.0 MiB");
    lu_buf_free(&b);
    /* memory_summary: PyTorch's table, then the device's private tags. */
    memset(&b, 0, sizeof b);
    LU_OK(tally_write_summary(0, 0, lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "PyTorch CUDA memory summary");
    assert_true(lu_pos(lu_buf_str(&b), "private tags") > lu_pos(lu_buf_str(&b), "PyTorch CUDA memory summary"));
    LU_LACKS(lu_buf_str(&b), "\n1      kv"); /* only device 0's rows */
    lu_buf_free(&b);
    /* The JSON report: sleeping (owned, not resident) and offload bytes. */
    char path[300];
    snprintf(path, sizeof path, "%s/sleep-report.json", lu_tmpdir());
    LU_OK(tally_write_report(path));
    tally_json_t *root = lu_json_file(path);
    const tally_json_t *rw = private_row(root, "weights", 0), *rk = private_row(root, "kv", 0);
    LU_EQ(lu_jbool(rw, "asleep"), 1);
    LU_EQ(lu_jbool(rw, "offloaded"), 1);
    LU_EQ(lu_jint(rw, "sleeping_bytes"), 10 * MB);
    LU_EQ(lu_jint(rw, "offload_bytes"), 10 * MB);
    LU_EQ(lu_jint(rw, "mapped_bytes"), 0);
    LU_EQ(lu_jint(rk, "sleeping_bytes"), 6 * MB);
    LU_EQ(lu_jint(rk, "offload_bytes"), 0);
    /* Still owned: the ledger keeps counting them. */
    LU_EQ(lu_jint(lu_ledger_row(root, "weights", "rollout", 0), "current_bytes"), 10 * MB);
    const tally_json_t *tl = lu_jarr(root, "timeline");
    int sleeps = 0;
    for (size_t i = 0; i < tl->len; i++)
        sleeps += strcmp(lu_jstr(&tl->items[i], "action"), "sleep") == 0 && lu_jint(&tl->items[i], "device") == 0 &&
                  lu_jint(&tl->items[i], "size") > 0;
    LU_EQ(sleeps, 2); /* each tag on device 0, with the bytes it unmapped */
    tally__json_free(root);
    /* tally plot marks each sleep on the timeline (the command next to this
     * test's directory: build/bin/tally). */
    char exe[PATH_MAX], cmd[3 * PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(cmd, sizeof cmd, "'%s/../bin/tally' plot --device 0 '%s' -o '%s.svg' > /dev/null", exe, path, path);
    LU_EQ(system(cmd), 0);
    char svg[320];
    snprintf(svg, sizeof svg, "%s.svg", path);
    char *text = lu_read_file(svg, NULL);
    LU_HAS(text, "<path class=\"sleep\"");
    LU_HAS(text, "<title>tag weights slept: 10485760 bytes unmapped</title>");
    /* kv's 6 MiB block sits in a 20 MiB segment: all of it goes */
    LU_HAS(text, "<title>tag kv slept: 20971520 bytes unmapped</title>");
    free(text);
    /* The leak report counts the sleeping blocks still owned. */
    memset(&b, 0, sizeof b);
    LU_OK(tally_write_leaks(0, lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "tally: SUMMARY: 2 of those blocks (16777216 bytes) are asleep");
    lu_buf_free(&b);
    /* The stage report says which tags slept and woke. */
    LU_OK(tally_wake(W, 1));
    lu_cap_begin();
    LU_OK(tally_stage_end("rollout"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "tally: stage rollout: private tags weights slept (offloaded to host), kv slept "
                          "(discarded), weights woke");
    LU_OK(tally_wake(KV, 1));
    tally_free(w);
    tally_free(k);
    LU_OK(tally_configure("timeline:false"));
    LU_CHECK_OK();
}

/* A stage's report names the sleeps and wakes since that stage began: an
 * inner stage its own only, the outer one all of them; a refused end (a
 * stage that is not the innermost) takes nothing from either. Each stage
 * keeps its mark in its own frame. */
static void test_each_stage_report_names_the_sleeps_since_its_own_begin(void **state)
{
    (void)state;
    void *w = tagged("weights", 4 * MB, 0), *k = tagged("kv", 4 * MB, 0);
    LU_OK(tally_stage_begin("outer"));
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_DISCARD));
    LU_OK(tally_stage_begin("inner"));
    LU_OK(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD));
    lu_cap_begin();
    LU_EQ(tally_stage_end("outer"), -TALLY_ESTATE);
    lu_cap_end();
    LU_HAS(lu_cap_text(), "'outer' is not the innermost stage (that is 'inner')");
    LU_OK(tally_wake(W, 1));
    lu_cap_begin();
    LU_OK(tally_stage_end("inner"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "tally: stage inner: private tags kv slept (discarded), weights woke\n");
    LU_OK(tally_wake(KV, 1));
    lu_cap_begin();
    LU_OK(tally_stage_end("outer"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "tally: stage outer: private tags weights slept (discarded), kv slept (discarded), "
                          "weights woke, kv woke\n");
    /* A stage with no sleep or wake in it names none. */
    LU_OK(tally_stage_begin("quiet"));
    lu_cap_begin();
    LU_OK(tally_stage_end("quiet"));
    lu_cap_end();
    assert_null(strstr(lu_cap_text(), "private tags"));
    tally_free(w);
    tally_free(k);
    LU_CHECK_OK();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_private_tags_get_pages_of_their_own),
        T(test_set_private_at_run_time),
        T(test_discard_unmaps_and_wake_maps_back),
        T(test_offload_restores_every_byte),
        T(test_several_tags_in_one_call),
        T(test_sleep_sync_device_counts_one_device_sync_per_device),
        T(test_sleep_releases_free_segments),
        T(test_segments_freed_while_asleep),
        T(test_reports_show_sleeping_bytes),
        T(test_each_stage_report_names_the_sleeps_since_its_own_begin),
    };
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    setenv("TALLY_CONF", CONF, 1);
    int failed = cmocka_run_group_tests_name("sleep", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
