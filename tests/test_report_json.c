/* The ownership ledger: the JSON report (its documented keys, an
 * unwritable path, %p and %r in the path) and its timeline of events.
 *
 * Two simulated 80 GiB devices in virtual mode (LU_LEDGER_CONF); every test
 * frees what it takes and leaves no tag pushed and no stage open. */
#include "ledgerutil.h"

#define MB LU_MiB

/* ---- JSON report ------------------------------------------------------------------ */

static void test_json_report_has_the_documented_keys(void **state)
{
    (void)state;
    setenv("RANK", "5", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("WORLD_SIZE", "8", 1);
    lu_cap_begin();
    LU_OK(tally_stage_begin("js-stage"));
    LU_OK(tally_tag_push("js-tag"));
    void *a = lu_malloc(3 * MB, 0);
    void *b = lu_malloc(700, 1);
    LU_OK(tally_tag_pop());
    LU_OK(tally_stage_end("js-stage"));
    lu_cap_end();
    tally_json_t *root = lu_report_json("keys.json");
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    assert_int_equal(root->type, TALLY_JSON_OBJECT);
    LU_STREQ(lu_jstr(root, "format"), "tally-report");
    LU_STREQ(lu_jstr(root, "version"), TALLY_VERSION);
    LU_STREQ(lu_jstr(root, "backend"), "host");
    LU_EQ(lu_jint(root, "pid"), getpid());
    LU_EQ(lu_jint(root, "rank"), 5);
    LU_EQ(lu_jint(root, "local_rank"), 1);
    LU_EQ(lu_jint(root, "world_size"), 8);
    LU_EQ(lu_jint(root, "home_device"), -1); /* LOCAL_RANK was unset at initialisation */
    lu_jint(root, "time_us");
    /* devices[].stats: the 122 memory_stats keys, matching the live figures. */
    const tally_json_t *devs = lu_jarr(root, "devices");
    LU_EQ(devs->len, 2);
    for (size_t i = 0; i < devs->len; i++) {
        LU_EQ(lu_jint(&devs->items[i], "device"), i);
        const tally_json_t *st = lu_jget(&devs->items[i], "stats");
        assert_int_equal(st->type, TALLY_JSON_OBJECT);
        LU_EQ(st->len, 122);
        for (size_t k = 0; k < st->len; k++) {
            int64_t v;
            if (tally__json_int(&st->members[k].value, &v) != 0)
                fail_msg("stats key %s is not an integer", st->members[k].key);
            if (k && strcmp(st->members[k - 1].key, st->members[k].key) >= 0)
                fail_msg("stats keys not sorted: %s before %s", st->members[k - 1].key, st->members[k].key);
        }
        tally_stats_t s = lu_stats((int)i);
        const tally_json_t *u = lu_jget(&devs->items[i], "utilisation");
        assert_int_equal(u->type, TALLY_JSON_NUMBER);
        if (!(u->d > s.utilisation - 1e-6 && u->d < s.utilisation + 1e-6))
            fail_msg("device %zu: utilisation %.9f in the report, %.9f in the stats", i, u->d, s.utilisation);
        LU_EQ(lu_jint(st, "allocated_bytes.all.current"), s.allocated_bytes[0].current);
        LU_EQ(lu_jint(st, "reserved_bytes.all.current"), s.reserved_bytes[0].current);
        LU_EQ(lu_jint(st, "allocation.all.current"), s.allocation[0].current);
        lu_jint(st, "num_device_alloc");
        lu_jint(st, "requested_bytes.large_pool.peak");
    }
    /* ledger[]: every documented field, with its type. */
    const tally_json_t *rows = lu_jarr(root, "ledger");
    assert_true(rows->len >= 2);
    static const char *const int_fields[] = {"device", "current_bytes", "peak_bytes", "allocated_bytes",
                                             "freed_bytes", "live_blocks", "peak_blocks", "allocated_blocks"};
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *r = &rows->items[i];
        lu_jstr(r, "tag");
        lu_jstr(r, "stage");
        lu_jbool(r, "foreign");
        for (size_t k = 0; k < sizeof int_fields / sizeof int_fields[0]; k++)
            lu_jint(r, int_fields[k]);
    }
    const tally_json_t *ra = lu_ledger_row(root, "js-tag", "js-stage", 0);
    assert_non_null(ra);
    LU_EQ(lu_jint(ra, "current_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "peak_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "allocated_bytes"), 3 * MB);
    LU_EQ(lu_jint(ra, "freed_bytes"), 0);
    LU_EQ(lu_jint(ra, "live_blocks"), 1);
    LU_EQ(lu_jint(ra, "peak_blocks"), 1);
    LU_EQ(lu_jint(ra, "allocated_blocks"), 1);
    LU_EQ(lu_jbool(ra, "foreign"), 0);
    const tally_json_t *rb = lu_ledger_row(root, "js-tag", "js-stage", 1);
    assert_non_null(rb);
    LU_EQ(lu_jint(rb, "current_bytes"), 1024);
    /* stages[]: the history, with survivors. */
    const tally_json_t *stages = lu_jarr(root, "stages");
    assert_true(stages->len >= 1);
    int64_t total = lu_jint(root, "stages_total");
    LU_EQ(stages->len, total < 256 ? total : 256); /* the newest 256 are kept */
    const tally_json_t *st = &stages->items[stages->len - 1];
    LU_STREQ(lu_jstr(st, "name"), "js-stage");
    LU_EQ(lu_jint(st, "seq"), lu_jint(root, "stages_total"));
    LU_EQ(lu_jint(st, "depth"), 1);
    assert_true(lu_jint(st, "begin_us") > 0);
    assert_true(lu_jint(st, "wall_us") >= 0);
    LU_EQ(lu_jint(st, "peak_allocated_bytes"), 3 * MB + 1024);
    assert_true(lu_jint(st, "peak_reserved_bytes") >= 22 * (int64_t)MB);
    LU_EQ(lu_jint(st, "survivor_bytes"), 3 * MB + 1024);
    LU_EQ(lu_jint(st, "survivor_blocks"), 2);
    LU_EQ(lu_jint(st, "released_bytes"), 0);
    const tally_json_t *sv = lu_jarr(st, "survivors");
    LU_EQ(sv->len, 2);
    LU_STREQ(lu_jstr(&sv->items[0], "tag"), "js-tag");
    LU_EQ(lu_jint(&sv->items[0], "device"), 0);
    LU_EQ(lu_jbool(&sv->items[0], "foreign"), 0);
    LU_EQ(lu_jint(&sv->items[0], "bytes"), 3 * MB);
    LU_EQ(lu_jint(&sv->items[0], "blocks"), 1);
    /* leaks[]: live blocks grouped. */
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    int found = 0;
    for (size_t i = 0; i < leaks->len; i++) {
        const tally_json_t *g = &leaks->items[i];
        lu_jstr(g, "site");
        lu_jbool(g, "foreign");
        if (strcmp(lu_jstr(g, "tag"), "js-tag") == 0 && strcmp(lu_jstr(g, "stage"), "js-stage") == 0 &&
            lu_jint(g, "device") == 0) {
            LU_EQ(lu_jint(g, "bytes"), 3 * MB);
            LU_EQ(lu_jint(g, "blocks"), 1);
            found++;
        }
    }
    LU_EQ(found, 1);
    /* segments[] and timeline[] are there (the timeline empty while off). */
    const tally_json_t *segs = lu_jarr(root, "segments");
    assert_true(segs->len >= 2);
    LU_EQ(lu_jarr(root, "timeline")->len, 0);
    tally__json_free(root);
    tally_free(a);
    tally_free(b);
}

/* leaks[].suppressed: the JSON report reads leak_suppressions as the exit
 * report does, so a group a rule matches (here by its tag) says true and
 * the group beside it, at the same stage and device, false. */
static void test_json_report_marks_suppressed_leaks(void **state)
{
    (void)state;
    char supp[512];
    snprintf(supp, sizeof supp, "%s/json.supp", lu_tmpdir());
    FILE *f = fopen(supp, "w");
    assert_non_null(f);
    fputs("leak:^js-kept$\n", f);
    fclose(f);
    char conf[600];
    snprintf(conf, sizeof conf, "leak_suppressions:%s", supp);
    LU_OK(tally_configure(conf));
    LU_OK(tally_tag_push("js-kept"));
    void *kept = lu_malloc(2 * MB, 0);
    LU_OK(tally_tag_pop());
    LU_OK(tally_tag_push("js-lost"));
    void *lost = lu_malloc(4 * MB, 0);
    LU_OK(tally_tag_pop());
    tally_json_t *root = lu_report_json("suppressed.json");
    LU_OK(tally_configure("leak_suppressions:"));
    const tally_json_t *leaks = lu_jarr(root, "leaks");
    int seen_kept = 0, seen_lost = 0;
    for (size_t i = 0; i < leaks->len; i++) {
        const tally_json_t *g = &leaks->items[i];
        if (strcmp(lu_jstr(g, "tag"), "js-kept") == 0) {
            LU_EQ(lu_jbool(g, "suppressed"), 1);
            LU_EQ(lu_jint(g, "bytes"), 2 * MB);
            seen_kept++;
        } else if (strcmp(lu_jstr(g, "tag"), "js-lost") == 0) {
            LU_EQ(lu_jbool(g, "suppressed"), 0);
            LU_EQ(lu_jint(g, "bytes"), 4 * MB);
            seen_lost++;
        }
    }
    LU_EQ(seen_kept, 1);
    LU_EQ(seen_lost, 1);
    tally__json_free(root);
    tally_free(kept);
    tally_free(lost);
}

static void test_json_report_unwritable_path_fails_cleanly(void **state)
{
    (void)state;
    char path[512];
    lu_cap_begin();
    /* A directory that does not exist. */
    snprintf(path, sizeof path, "%s/no-such-dir/report.json", lu_tmpdir());
    LU_EQ(tally_write_report(path), -TALLY_EIO);
    LU_HAS(tally_last_error(), "tally_write_report");
    LU_HAS(tally_last_error(), path);
    assert_false(lu_exists(path));
    /* A path that is a directory: written to a temporary, rename fails,
     * nothing is left behind. */
    snprintf(path, sizeof path, "%s/a-directory", lu_tmpdir());
    assert_int_equal(mkdir(path, 0755), 0);
    char inside[600];
    snprintf(inside, sizeof inside, "%s/keep", path);
    FILE *f = fopen(inside, "w");
    assert_non_null(f);
    fclose(f);
    LU_EQ(tally_write_report(path), -TALLY_EIO);
    LU_HAS(tally_last_error(), path);
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    /* No path at all: report_path is not set. */
    LU_EQ(tally_write_report(NULL), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "report_path");
    /* A too-long expansion. */
    char longpath[1100];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = 0;
    LU_EQ(tally_write_report(longpath), -TALLY_EINVAL);
    lu_cap_end();
    /* The errors went to the sink, one line each. */
    LU_EQ(lu_cap_lines(), 4);
}

/* A program whose standard input is closed (a daemon, a job under a launcher
 * that closes it) gets descriptor 0 for the next file it opens: the report's
 * temporary then is descriptor 0, and the report is written as any other. */
static void test_json_report_written_with_stdin_closed(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/stdin-closed.json", lu_tmpdir());
    int saved = dup(0);
    assert_true(saved > 0);
    assert_int_equal(close(0), 0);
    int rc = tally_write_report(path);
    int again = dup2(saved, 0);
    close(saved);
    assert_int_equal(again, 0);
    if (rc != 0)
        fail_msg("tally_write_report with descriptor 0 free: %d (%s)", rc, tally_last_error());
    tally_json_t *root = lu_json_file(path);
    LU_EQ(lu_jint(root, "pid"), getpid());
    tally__json_free(root);
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
}

static void test_json_report_path_expands_pid_and_rank(void **state)
{
    (void)state;
    char pattern[512], want[512];
    snprintf(pattern, sizeof pattern, "%s/r%%r-p%%p-%%%%.json", lu_tmpdir());
    snprintf(want, sizeof want, "%s/r0-p%d-%%.json", lu_tmpdir(), (int)getpid());
    LU_OK(tally_write_report(pattern));
    assert_true(lu_exists(want));
    tally_json_t *root = lu_json_file(want);
    LU_EQ(lu_jint(root, "pid"), getpid());
    LU_EQ(lu_jint(root, "rank"), 0);
    LU_EQ(lu_jint(root, "world_size"), 1);
    tally__json_free(root);
    /* Replaced atomically: writing again leaves one file, no temporary. */
    LU_OK(tally_write_report(pattern));
    LU_EQ(lu_dir_count(lu_tmpdir(), ".tmp"), 0);
    setenv("RANK", "3", 1);
    LU_OK(tally_write_report(pattern));
    unsetenv("RANK");
    snprintf(want, sizeof want, "%s/r3-p%d-%%.json", lu_tmpdir(), (int)getpid());
    assert_true(lu_exists(want));
    /* report_path is used when the path is NULL. */
    char conf[600];
    snprintf(conf, sizeof conf, "report_path:%s/configured-%%p.json", lu_tmpdir());
    LU_OK(tally_configure(conf));
    LU_OK(tally_write_report(NULL));
    LU_OK(tally_configure("report_path:"));
    snprintf(want, sizeof want, "%s/configured-%d.json", lu_tmpdir(), (int)getpid());
    assert_true(lu_exists(want));
}

/* rank, local_rank and world_size are the launcher's variables as set, from 0
 * to 2^20; anything else (negative, too large, not a number, empty) is taken
 * as unset: 0, 0 and 1 (docs/reports.md). WORLD_SIZE=0 is 0, not unset. */
static void test_json_report_launcher_variables_as_set_within_bounds(void **state)
{
    (void)state;
    static const struct {
        const char *name, *value, *key;
        int want;
    } cases[] = {
        {"WORLD_SIZE", "0", "world_size", 0},
        {"WORLD_SIZE", "1048576", "world_size", 1048576},
        {"WORLD_SIZE", "1048577", "world_size", 1},
        {"WORLD_SIZE", "-1", "world_size", 1},
        {"WORLD_SIZE", "4x", "world_size", 1},
        {"WORLD_SIZE", "", "world_size", 1},
        {"RANK", "0", "rank", 0},
        {"RANK", "1048576", "rank", 1048576},
        {"RANK", "1048577", "rank", 0},
        {"RANK", "-3", "rank", 0},
        {"LOCAL_RANK", "7", "local_rank", 7},
        {"LOCAL_RANK", "-1", "local_rank", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i].name, cases[i].value, 1);
        tally_json_t *root = lu_report_json("launcher.json");
        unsetenv(cases[i].name);
        int64_t got = lu_jint(root, cases[i].key);
        tally__json_free(root);
        if (got != cases[i].want)
            fail_msg("%s=\"%s\": %s %lld in the report, expected %d", cases[i].name, cases[i].value, cases[i].key,
                     (long long)got, cases[i].want);
    }
}

/* ---- timeline ------------------------------------------------------------------- */

static int has_event(const tally_json_t *tl, const char *action, const char *tag, int device)
{
    for (size_t i = 0; i < tl->len; i++) {
        const tally_json_t *e = &tl->items[i];
        if (strcmp(lu_jstr(e, "action"), action) == 0 && (!tag || strcmp(lu_jstr(e, "tag"), tag) == 0) &&
            (device < 0 || lu_jint(e, "device") == device))
            return 1;
    }
    return 0;
}

static void test_timeline_records_events(void **state)
{
    (void)state;
    LU_OK(tally_configure("timeline:true"));
    lu_cap_begin();
    LU_OK(tally_stage_begin("tl-stage"));
    LU_OK(tally_tag_push("tl-tag"));
    void *a = lu_malloc(30 * MB, 1); /* a new segment */
    void *b = lu_malloc(1000, 0);
    LU_OK(tally_tag_pop());
    tally_free(a);
    LU_OK(tally_stage_end("tl-stage"));
    tally_empty_cache(1);
    lu_cap_end();
    tally_json_t *root = lu_report_json("timeline.json");
    LU_OK(tally_configure("timeline:false"));
    void *c = lu_malloc(1000, 0); /* not recorded */
    const tally_json_t *tl = lu_jarr(root, "timeline");
    assert_true(tl->len >= 6);
    assert_true(has_event(tl, "segment_alloc", "tl-tag", 1));
    assert_true(has_event(tl, "alloc", "tl-tag", 1));
    assert_true(has_event(tl, "alloc", "tl-tag", 0));
    assert_true(has_event(tl, "free_requested", NULL, 1));
    assert_true(has_event(tl, "segment_free", NULL, 1));
    assert_true(has_event(tl, "stage_begin", NULL, 0));
    assert_true(has_event(tl, "stage_end", NULL, 1));
    int allocs = 0;
    for (size_t i = 0; i < tl->len; i++) {
        const tally_json_t *e = &tl->items[i];
        lu_jint(e, "time_us");
        lu_jint(e, "addr");
        lu_jint(e, "size");
        lu_jint(e, "stream");
        lu_jint(e, "allocated");
        lu_jint(e, "reserved");
        lu_jstr(e, "stage");
        /* Stage marks move no memory: address, size and stream are 0. */
        const char *act = lu_jstr(e, "action");
        if (strcmp(act, "stage_begin") == 0 || strcmp(act, "stage_end") == 0) {
            LU_EQ(lu_jint(e, "addr"), 0);
            LU_EQ(lu_jint(e, "size"), 0);
            LU_EQ(lu_jint(e, "stream"), 0);
        }
        if (strcmp(lu_jstr(e, "action"), "alloc") == 0 && lu_jint(e, "device") == 1) {
            allocs++;
            LU_EQ(lu_jint(e, "addr"), (uintptr_t)a);
            LU_EQ(lu_jint(e, "size"), 30 * MB);
            LU_STREQ(lu_jstr(e, "stage"), "tl-stage");
            assert_true(lu_jint(e, "allocated") >= 30 * (int64_t)MB);
        }
    }
    LU_EQ(allocs, 1);
    /* Oldest first, per device. */
    int64_t last = 0;
    for (size_t i = 0; i < tl->len; i++) {
        if (lu_jint(&tl->items[i], "device") != 1)
            continue;
        assert_true(lu_jint(&tl->items[i], "time_us") >= last);
        last = lu_jint(&tl->items[i], "time_us");
    }
    tally__json_free(root);
    tally_free(b);
    tally_free(c);
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        LU_T(test_json_report_has_the_documented_keys),
        LU_T(test_json_report_marks_suppressed_leaks),
        LU_T(test_json_report_unwritable_path_fails_cleanly),
        LU_T(test_json_report_written_with_stdin_closed),
        LU_T(test_json_report_path_expands_pid_and_rank),
        LU_T(test_json_report_launcher_variables_as_set_within_bounds),
        LU_T(test_timeline_records_events),
    };
    return LU_LEDGER_RUN("json_report", tests);
}
