/* The problems tally exists for (design notes), end to end:
 *
 * - "model built twice": a pipeline builds a model during stage load, then a
 *   second instance; the first (tag model-init, 8 GiB) is never freed. The
 *   stage-end report must name it in one line, leave out the persistent
 *   weights and the freed scratch, and (release_at_stage_end) give back
 *   exactly the scratch segments.
 * - "four ranks": four processes (this binary re-executed with RANK,
 *   LOCAL_RANK, WORLD_SIZE) each load a checkpoint onto device 0 instead of
 *   their own; each writes report_path rank%r.json at exit. Ranks 1-3 must
 *   show the memory as foreign, in the JSON and in the stage-end line.
 *
 * The parent runs on two simulated 80 GiB devices in virtual mode. */
#include "ledgerutil.h"

#define CONF "backend:host,host_devices:2,host_mode:virtual,host_capacity:80GiB,persistent_tags:weights|optimizer"

#define GB LU_GiB
#define MB LU_MiB

static int setup_clean(void **state)
{
    (void)state;
    tally_set_sink(NULL, NULL);
    tally_empty_cache(-1);
    return 0;
}

/* ---- model built twice ------------------------------------------------------ */

typedef struct model_run {
    void *weights;
    void *init[4];   /* the first instance: 4 x 2 GiB, never freed */
    void *scratch[3];
} model_run_t;

/* Stage load: weights 4 GiB (persistent), model-init 8 GiB kept, scratch
 * 3 x 1.5 GiB taken and freed. Returns with the stage still open. */
static void load_model_twice(model_run_t *m)
{
    LU_OK(tally_stage_begin("load"));
    LU_OK(tally_tag_push("weights"));
    m->weights = lu_malloc(4 * GB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("model-init"));
    for (int i = 0; i < 4; i++)
        m->init[i] = lu_malloc(2 * GB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("scratch"));
    for (int i = 0; i < 3; i++)
        m->scratch[i] = lu_malloc(3 * GB / 2, 0);
    LU_OK(tally_tag_pop());
    for (int i = 0; i < 3; i++)
        tally_free(m->scratch[i]);
    LU_STREQ(lu_tag_of(m->init[0]), "model-init");
    LU_STREQ(lu_stage_of(m->init[0]), "load");
}

static void unload_model(model_run_t *m)
{
    tally_free(m->weights);
    for (int i = 0; i < 4; i++)
        tally_free(m->init[i]);
    tally_empty_cache(-1);
    LU_CHECK_OK();
}

static void test_model_built_twice_names_model_init(void **state)
{
    (void)state;
    model_run_t m;
    lu_cap_begin();
    load_model_twice(&m);
    int64_t reserved = lu_stats(0).reserved_bytes[0].current;
    LU_OK(tally_stage_end("load"));
    lu_cap_end();
    const char *t = lu_cap_text();
    LU_HAS(t, "stage load ended with 8.0 GiB still live under tag model-init on device 0");
    LU_HAS(t, "tally: stage load ended with 8.0 GiB still live under tag model-init on device 0 (4 blocks)\n");
    LU_HAS(t, "peak allocated 16.5 GiB, peak reserved 16.5 GiB; 8.0 GiB in 4 blocks outlive it\n");
    /* One finding, nothing else: not the weights, not the scratch. */
    LU_EQ(lu_count(t, "still live under tag"), 1);
    LU_LACKS(t, "tag weights");
    LU_LACKS(t, "scratch");
    LU_LACKS(t, "released");
    LU_EQ(lu_count(t, "\n"), 2);
    /* Without release_at_stage_end the cache keeps the scratch segments. */
    LU_EQ(lu_stats(0).reserved_bytes[0].current, reserved);
    LU_EQ(reserved, (int64_t)(16 * GB + GB / 2));
    /* The ledger agrees: model-init / load / device 0 holds 8 GiB. */
    tally_json_t *root = lu_report_json("model.json");
    const tally_json_t *row = lu_ledger_row(root, "model-init", "load", 0);
    assert_non_null(row);
    LU_EQ(lu_jint(row, "current_bytes"), 8 * GB);
    LU_EQ(lu_jint(row, "live_blocks"), 4);
    row = lu_ledger_row(root, "scratch", "load", 0);
    assert_non_null(row);
    LU_EQ(lu_jint(row, "current_bytes"), 0);
    LU_EQ(lu_jint(row, "peak_bytes"), (int64_t)(4 * GB + GB / 2));
    tally__json_free(root);
    /* So does the leak view. */
    lu_buf_t b = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &b));
    LU_HAS(lu_buf_str(&b), "tally: 8589934592 bytes (8.0 GiB) in 4 blocks: tag model-init, stage load, device 0\n");
    LU_HAS(lu_buf_str(&b), "tally: 4294967296 bytes (4.0 GiB) in 1 block: tag weights, stage load, device 0\n");
    assert_true(lu_pos(lu_buf_str(&b), "model-init") < lu_pos(lu_buf_str(&b), "tag weights"));
    lu_buf_free(&b);
    unload_model(&m);
}

static void test_model_built_twice_release_gives_back_the_scratch(void **state)
{
    (void)state;
    LU_OK(tally_configure("release_at_stage_end:true"));
    model_run_t m;
    lu_cap_begin();
    load_model_twice(&m);
    tally_stats_t before = lu_stats(0), other_before = lu_stats(1);
    LU_OK(tally_stage_end("load"));
    lu_cap_end();
    LU_OK(tally_configure("release_at_stage_end:false"));
    tally_stats_t after = lu_stats(0), other_after = lu_stats(1);
    const char *t = lu_cap_text();
    LU_HAS(t, "tally: stage load ended with 8.0 GiB still live under tag model-init on device 0 (4 blocks)\n");
    /* Reserved drops by exactly the three scratch segments. */
    int64_t scratch = 3 * (int64_t)(3 * GB / 2);
    LU_EQ(before.reserved_bytes[0].current - after.reserved_bytes[0].current, scratch);
    LU_EQ(after.reserved_bytes[0].current, (int64_t)(12 * GB));
    LU_EQ(after.num_device_free - before.num_device_free, 3);
    LU_EQ(after.segment[0].current, 5);
    LU_EQ(after.allocated_bytes[0].current, before.allocated_bytes[0].current);
    LU_EQ(other_after.reserved_bytes[0].current, other_before.reserved_bytes[0].current);
    LU_HAS(t, "tally: stage load released 4.5 GiB of cached segments; 12.0 GiB stays reserved\n");
    assert_true(lu_pos(t, "under tag model-init") < lu_pos(t, "released"));
    tally_json_t *root = lu_report_json("model-release.json");
    const tally_json_t *stages = lu_jarr(root, "stages");
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "load");
    LU_EQ(lu_jint(st, "released_bytes"), scratch);
    LU_EQ(lu_jint(st, "survivor_bytes"), 8 * GB);
    tally__json_free(root);
    unload_model(&m);
}

static void test_model_fixed_leaves_nothing_behind(void **state)
{
    (void)state;
    /* The fix: the first instance is freed before the stage ends. */
    model_run_t m;
    lu_cap_begin();
    load_model_twice(&m);
    for (int i = 0; i < 4; i++)
        tally_free(m.init[i]);
    LU_OK(tally_stage_end("load"));
    lu_cap_end();
    LU_HAS(lu_cap_text(), "; nothing outlives it\n");
    LU_LACKS(lu_cap_text(), "still live");
    tally_free(m.weights);
    tally_empty_cache(-1);
}

/* ---- four ranks ---------------------------------------------------------------- */

/* One rank: its own weights on its home device, and (the bug) the checkpoint
 * on device 0. */
static int child_rank(void)
{
    const char *r = getenv("RANK");
    LU_REQUIRE(r != NULL);
    int rank = atoi(r);
    LU_REQUIRE(tally_device_count() == 4);
    LU_REQUIRE(tally_stage_begin("load") == 0);
    LU_REQUIRE(tally_tag_push("weights") == 0);
    void *w = tally_malloc(2 * GB, rank, NULL);
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(tally_tag_push("checkpoint") == 0);
    void *ckpt = tally_malloc(GB + (size_t)rank * 100 * MB, 0, NULL);
    void *tmp = tally_malloc(300 * MB, 0, NULL); /* read buffer, freed */
    LU_REQUIRE(tally_tag_pop() == 0);
    LU_REQUIRE(w && ckpt && tmp);
    tally_free(tmp);
    LU_REQUIRE(tally_stage_end("load") == 0);
    printf("rank %d done\n", rank);
    return 0; /* report_path is written at exit */
}

static void test_four_ranks_report_foreign_checkpoint(void **state)
{
    (void)state;
    enum { WORLD = 4 };
    char conf[600];
    snprintf(conf, sizeof conf, "backend:host,host_devices:4,host_mode:virtual,host_capacity:80GiB,"
                                "persistent_tags:weights,report_path:%s/rank%%r.json", lu_tmpdir());
    lu_child_t c[WORLD];
    char env[WORLD][3][32];
    for (int r = 0; r < WORLD; r++) {
        snprintf(env[r][0], sizeof env[r][0], "RANK=%d", r);
        snprintf(env[r][1], sizeof env[r][1], "LOCAL_RANK=%d", r);
        snprintf(env[r][2], sizeof env[r][2], "WORLD_SIZE=%d", WORLD);
        const char *e[] = {env[r][0], env[r][1], env[r][2], NULL};
        lu_child_start(&c[r], "rank", conf, e);
    }
    for (int r = 0; r < WORLD; r++)
        lu_child_wait(&c[r]);
    int64_t device0_total = 0, device0_foreign = 0;
    for (int r = 0; r < WORLD; r++) {
        LU_CHILD_EXIT(&c[r], 0);
        char done[32];
        snprintf(done, sizeof done, "rank %d done\n", r);
        LU_HAS(c[r].out, done);
        int64_t ckpt = (int64_t)(GB + (size_t)r * 100 * MB);
        char path[400];
        snprintf(path, sizeof path, "%s/rank%d.json", lu_tmpdir(), r);
        tally_json_t *root = lu_json_file(path);
        LU_EQ(lu_jint(root, "rank"), r);
        LU_EQ(lu_jint(root, "local_rank"), r);
        LU_EQ(lu_jint(root, "world_size"), WORLD);
        LU_EQ(lu_jint(root, "home_device"), r);
        LU_EQ(lu_jint(root, "pid"), c[r].pid);
        LU_EQ(lu_jarr(root, "devices")->len, 4);
        /* The checkpoint row on device 0: foreign for every rank but 0. */
        const tally_json_t *row = lu_ledger_row(root, "checkpoint", "load", 0);
        assert_non_null(row);
        LU_EQ(lu_jint(row, "current_bytes"), ckpt);
        LU_EQ(lu_jbool(row, "foreign"), r != 0);
        device0_total += lu_jint(row, "current_bytes");
        /* Every row on device 0 of ranks 1..3 is foreign; every row on the
         * home device is not. */
        const tally_json_t *rows = lu_jarr(root, "ledger");
        for (size_t i = 0; i < rows->len; i++) {
            int64_t dev = lu_jint(&rows->items[i], "device");
            LU_EQ(lu_jbool(&rows->items[i], "foreign"), dev != r);
            if (dev == 0 && r != 0)
                device0_foreign += lu_jint(&rows->items[i], "current_bytes");
        }
        row = lu_ledger_row(root, "weights", "load", r);
        assert_non_null(row);
        LU_EQ(lu_jint(row, "current_bytes"), 2 * GB);
        LU_EQ(lu_jbool(row, "foreign"), 0);
        /* The stage history: the checkpoint survived load (weights are persistent). */
        const tally_json_t *stages = lu_jarr(root, "stages");
        LU_EQ(stages->len, 1);
        const tally_json_t *sv = lu_jarr(&stages->items[0], "survivors");
        LU_EQ(sv->len, 1);
        LU_STREQ(lu_jstr(&sv->items[0], "tag"), "checkpoint");
        LU_EQ(lu_jint(&sv->items[0], "device"), 0);
        LU_EQ(lu_jbool(&sv->items[0], "foreign"), r != 0);
        LU_EQ(lu_jint(&sv->items[0], "bytes"), ckpt);
        /* Leaks at exit, grouped, with the foreign flag. */
        const tally_json_t *leaks = lu_jarr(root, "leaks");
        LU_EQ(leaks->len, 2);
        tally__json_free(root);
        /* The one-line finding on stderr. */
        char line[300], size[32];
        lu_fmt_bytes((uint64_t)ckpt, size, sizeof size);
        if (r == 0)
            snprintf(line, sizeof line,
                     "tally: stage load ended with %s still live under tag checkpoint on device 0 (1 block)\n", size);
        else
            snprintf(line, sizeof line,
                     "tally: stage load ended with %s still live under tag checkpoint on device 0 (1 block) "
                     "(foreign: home device is %d)\n",
                     size, r);
        LU_HAS(c[r].err, line);
        if (r == 0)
            LU_LACKS(c[r].err, "foreign");
        /* The default leak_report (summary) names what was left at exit. */
        char summary[200];
        snprintf(summary, sizeof summary, "tally: SUMMARY: %lld bytes leaked in 2 blocks\n",
                 (long long)(ckpt + 2 * (int64_t)GB));
        LU_HAS(c[r].err, summary);
        /* No temporary file is left next to the report. */
        lu_child_free(&c[r]);
    }
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
    /* Merged: device 0 holds 4.6 GiB of checkpoints, 3.6 GiB of it foreign. */
    LU_EQ(device0_total, (int64_t)(4 * GB + 600 * MB));
    LU_EQ(device0_foreign, (int64_t)(3 * GB + 600 * MB));
}

static void test_explicit_home_device_overrides_local_rank(void **state)
{
    (void)state;
    char conf[600];
    snprintf(conf, sizeof conf, "backend:host,host_devices:4,host_mode:virtual,home_device:0,"
                                "report_path:%s/explicit-%%r.json", lu_tmpdir());
    const char *e[] = {"RANK=2", "LOCAL_RANK=2", "WORLD_SIZE=4", NULL};
    lu_child_t c;
    lu_child_run(&c, "rank", conf, e);
    LU_CHILD_EXIT(&c, 0);
    char path[400];
    snprintf(path, sizeof path, "%s/explicit-2.json", lu_tmpdir());
    tally_json_t *root = lu_json_file(path);
    LU_EQ(lu_jint(root, "home_device"), 0);
    LU_EQ(lu_jint(root, "local_rank"), 2);
    /* Now the checkpoint on device 0 is at home, and the weights on 2 are not. */
    LU_EQ(lu_jbool(lu_ledger_row(root, "checkpoint", "load", 0), "foreign"), 0);
    LU_EQ(lu_jbool(lu_ledger_row(root, "weights", "load", 2), "foreign"), 1);
    tally__json_free(root);
    LU_LACKS(c.err, "under tag checkpoint on device 0 (1 block) (foreign");
    lu_child_free(&c);
}

/* ---- main ---------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"rank", child_rank},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    setenv("TALLY_CONF", CONF, 1);
#define T(f) cmocka_unit_test_setup(f, setup_clean)
    const struct CMUnitTest tests[] = {
        T(test_model_built_twice_names_model_init),
        T(test_model_built_twice_release_gives_back_the_scratch),
        T(test_model_fixed_leaves_nothing_behind),
        T(test_four_ranks_report_foreign_checkpoint),
        T(test_explicit_home_device_overrides_local_rank),
    };
#undef T
    int failed = cmocka_run_group_tests_name("scenarios", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
