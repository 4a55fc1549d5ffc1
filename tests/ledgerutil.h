/* Helpers for the ownership-ledger tests (test_ledger_tags_stages, test_ledger_counters,
 * test_report_stages, test_api_free_misuse, test_report_oom_and_leaks,
 * test_report_json, test_api_scenarios, test_api_exit). Self-contained: assertions, a growing capture sink, text
 * buffers, files, the library's JSON reader, and child processes that
 * re-execute the test binary (/proc/self/exe --child ROLE) with their own
 * TALLY_CONF and environment, so each child starts tally from scratch.
 *
 * Usage in main():  if (argc >= 3 && strcmp(argv[1], "--child") == 0)
 *                       return lu_child_main(argv[2], roles);           */
#ifndef TALLY_LEDGERUTIL_H
#define TALLY_LEDGERUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "orphan.h" /* tu_die_with_parent */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tally.h"
#include "report/json.h" /* the library's internal reader (tests link libtally.a) */
#include "ledger/stage.h" /* tally__stage_open, tally__g: lu_setup_clean's clean-up */

#define LU_KiB ((size_t)1 << 10)
#define LU_MiB ((size_t)1 << 20)
#define LU_GiB ((size_t)1 << 30)

/* ---- assertions ---------------------------------------------------------- */

#define LU_EQ(a, b)                                                                                               \
    do {                                                                                                          \
        long long lu_a_ = (long long)(a), lu_b_ = (long long)(b);                                                 \
        if (lu_a_ != lu_b_)                                                                                       \
            fail_msg("%s:%d: %s is %lld, expected %s = %lld", __FILE__, __LINE__, #a, lu_a_, #b, lu_b_);          \
    } while (0)

#define LU_STREQ(a, b)                                                                                            \
    do {                                                                                                          \
        const char *lu_a_ = (a), *lu_b_ = (b);                                                                    \
        if (!lu_a_ || !lu_b_ || strcmp(lu_a_, lu_b_) != 0)                                                        \
            fail_msg("%s:%d: %s is \"%s\", expected \"%s\"", __FILE__, __LINE__, #a, lu_a_ ? lu_a_ : "(null)",    \
                     lu_b_ ? lu_b_ : "(null)");                                                                   \
    } while (0)

/* s contains sub */
#define LU_HAS(s, sub)                                                                                            \
    do {                                                                                                          \
        const char *lu_s_ = (s), *lu_sub_ = (sub);                                                                \
        if (!lu_s_ || !strstr(lu_s_, lu_sub_))                                                                    \
            fail_msg("%s:%d: expected \"%s\" in:\n%s", __FILE__, __LINE__, lu_sub_, lu_s_ ? lu_s_ : "(null)");    \
    } while (0)

/* s does not contain sub */
#define LU_LACKS(s, sub)                                                                                          \
    do {                                                                                                          \
        const char *lu_s_ = (s), *lu_sub_ = (sub);                                                                \
        if (lu_s_ && strstr(lu_s_, lu_sub_))                                                                      \
            fail_msg("%s:%d: did not expect \"%s\" in:\n%s", __FILE__, __LINE__, lu_sub_, lu_s_);                 \
    } while (0)

#define LU_CHECK_OK()                                                                                             \
    do {                                                                                                          \
        if (tally_check() != 0)                                                                                   \
            fail_msg("%s:%d: tally_check failed: %s", __FILE__, __LINE__, tally_last_error());                   \
    } while (0)

/* rc == 0, else fail with tally's error */
#define LU_OK(expr)                                                                                               \
    do {                                                                                                          \
        int lu_rc_ = (expr);                                                                                      \
        if (lu_rc_ != 0)                                                                                          \
            fail_msg("%s:%d: %s returned %d: %s", __FILE__, __LINE__, #expr, lu_rc_, tally_last_error());        \
    } while (0)

/* Where sub first occurs in s (offset), or -1. */
static inline long lu_pos(const char *s, const char *sub)
{
    const char *p = s ? strstr(s, sub) : NULL;
    return p ? (long)(p - s) : -1;
}

static inline int lu_count(const char *s, const char *sub)
{
    int n = 0;
    size_t k = strlen(sub);
    for (const char *p = s; p && (p = strstr(p, sub)); p += k)
        n++;
    return n;
}

/* ---- growing text buffer: testutil.h's, under this file's names --------- */

typedef tu_buf_t lu_buf_t;
#define lu_buf_write tu_buf_write
#define lu_buf_free tu_buf_free

static inline const char *lu_buf_str(lu_buf_t *b)
{
    if (!b->p)
        tu_buf_write(b, "", 0);
    return b->p;
}

/* ---- capture sink --------------------------------------------------------- */

static pthread_mutex_t lu_cap_lock = PTHREAD_MUTEX_INITIALIZER;
static lu_buf_t lu_cap;
static int lu_cap_calls;

static inline void lu_cap_write(void *arg, const char *text, size_t len)
{
    (void)arg;
    pthread_mutex_lock(&lu_cap_lock);
    lu_buf_write(&lu_cap, text, len);
    lu_cap_calls++;
    pthread_mutex_unlock(&lu_cap_lock);
}

/* Start (or restart) capturing diagnostics into an empty buffer. */
static inline void lu_cap_begin(void)
{
    pthread_mutex_lock(&lu_cap_lock);
    lu_cap.len = 0;
    if (lu_cap.p)
        lu_cap.p[0] = 0;
    lu_cap_calls = 0;
    pthread_mutex_unlock(&lu_cap_lock);
    tally_set_sink(lu_cap_write, NULL);
}

static inline const char *lu_cap_text(void)
{
    return lu_buf_str(&lu_cap);
}

/* Number of '\n'-terminated lines captured. */
static inline int lu_cap_lines(void)
{
    return lu_count(lu_cap_text(), "\n");
}

static inline void lu_cap_end(void)
{
    tally_set_sink(NULL, NULL);
}

/* ---- statistics and blocks ----------------------------------------------- */

static inline tally_stats_t lu_stats(int device)
{
    tally_stats_t s;
    memset(&s, 0, sizeof s);
    if (tally_get_stats(device, &s) != 0)
        fail_msg("tally_get_stats(%d): %s", device, tally_last_error());
    return s;
}

static inline tally_block_info_t lu_info(const void *p)
{
    tally_block_info_t i;
    memset(&i, 0, sizeof i);
    if (tally_block_info(p, &i) != 0)
        fail_msg("tally_block_info(%p): %s", p, tally_last_error());
    return i;
}

static inline const char *lu_tag_of(const void *p)
{
    return tally_tag_name(lu_info(p).tag);
}

static inline const char *lu_stage_of(const void *p)
{
    return tally_stage_name(lu_info(p).stage);
}

static inline void *lu_malloc(size_t size, int device)
{
    void *p = tally_malloc(size, device, NULL);
    if (!p)
        fail_msg("tally_malloc(%zu, %d): %s", size, device, tally_last_error());
    return p;
}

/* Sum of reserved bytes over every device. */
static inline int64_t lu_reserved_all(void)
{
    int64_t r = 0;
    for (int d = 0; d < tally_device_count(); d++)
        r += lu_stats(d).reserved_bytes[TALLY_POOL_ALL].current;
    return r;
}

/* The figure as the reports print it ("8.0 GiB", "512 B"). */
static inline void lu_fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* ---- files and directories ----------------------------------------------- */

/* The whole file, NUL-terminated, malloc'd; NULL if it cannot be read. */
static inline char *lu_read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    lu_buf_t b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        lu_buf_write(&b, chunk, n);
    fclose(f);
    if (len_out)
        *len_out = b.len;
    return (char *)lu_buf_str(&b);
}

static inline bool lu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Names in dir containing sub, counted. */
static inline int lu_dir_count(const char *dir, const char *sub)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, sub))
            n++;
    closedir(d);
    return n;
}

static inline int lu_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static inline void lu_rm_tree(const char *dir)
{
    nftw(dir, lu_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under /tmp (static storage, one per binary). */
static char lu_tmpdir_path[256];
static inline const char *lu_tmpdir(void)
{
    if (!lu_tmpdir_path[0]) {
        snprintf(lu_tmpdir_path, sizeof lu_tmpdir_path, "/tmp/tally-ledger-test-XXXXXX");
        if (!mkdtemp(lu_tmpdir_path))
            fail_msg("mkdtemp: %s", strerror(errno));
    }
    return lu_tmpdir_path;
}

static inline void lu_tmpdir_cleanup(void)
{
    if (lu_tmpdir_path[0] && !getenv("LU_KEEP_TMP"))
        lu_rm_tree(lu_tmpdir_path);
}

/* ---- JSON ---------------------------------------------------------------- */

static inline tally_json_t *lu_json_parse(const char *text)
{
    char err[256];
    tally_json_t *root = tally__json_parse(text, strlen(text), err, sizeof err, NULL);
    if (!root)
        fail_msg("JSON does not parse (%s):\n%.2000s", err, text);
    return root;
}

/* Parse the file at path (fails the test if missing or malformed). */
static inline tally_json_t *lu_json_file(const char *path)
{
    char *text = lu_read_file(path, NULL);
    if (!text)
        fail_msg("cannot read %s: %s", path, strerror(errno));
    tally_json_t *root = lu_json_parse(text);
    free(text);
    return root;
}

/* Write the report to a fresh file in the temp directory and parse it. */
static inline tally_json_t *lu_report_json(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", lu_tmpdir(), name);
    if (tally_write_report(path) != 0)
        fail_msg("tally_write_report(%s): %s", path, tally_last_error());
    return lu_json_file(path);
}

static inline const tally_json_t *lu_jget(const tally_json_t *obj, const char *key)
{
    const tally_json_t *v = tally__json_get(obj, key);
    if (!v)
        fail_msg("JSON object lacks key \"%s\"", key);
    return v;
}

static inline int64_t lu_jint(const tally_json_t *obj, const char *key)
{
    int64_t x = 0;
    const tally_json_t *v = lu_jget(obj, key);
    if (tally__json_int(v, &x) != 0)
        fail_msg("JSON key \"%s\" is not an integer (%s)", key, tally__json_type_name(v->type));
    return x;
}

static inline const char *lu_jstr(const tally_json_t *obj, const char *key)
{
    const tally_json_t *v = lu_jget(obj, key);
    if (v->type != TALLY_JSON_STRING)
        fail_msg("JSON key \"%s\" is not a string (%s)", key, tally__json_type_name(v->type));
    return v->s;
}

/* 1 for true, 0 for false; fails otherwise. */
static inline int lu_jbool(const tally_json_t *obj, const char *key)
{
    const tally_json_t *v = lu_jget(obj, key);
    if (v->type != TALLY_JSON_TRUE && v->type != TALLY_JSON_FALSE)
        fail_msg("JSON key \"%s\" is not a boolean (%s)", key, tally__json_type_name(v->type));
    return v->type == TALLY_JSON_TRUE;
}

static inline const tally_json_t *lu_jarr(const tally_json_t *obj, const char *key)
{
    const tally_json_t *v = lu_jget(obj, key);
    if (v->type != TALLY_JSON_ARRAY)
        fail_msg("JSON key \"%s\" is not an array (%s)", key, tally__json_type_name(v->type));
    return v;
}

/* The first ledger row with this tag, stage and device, or NULL. */
static inline const tally_json_t *lu_ledger_row(const tally_json_t *root, const char *tag, const char *stage,
                                                int device)
{
    const tally_json_t *rows = lu_jarr(root, "ledger");
    for (size_t i = 0; i < rows->len; i++) {
        const tally_json_t *r = &rows->items[i];
        if (strcmp(lu_jstr(r, "tag"), tag) == 0 && (!stage || strcmp(lu_jstr(r, "stage"), stage) == 0) &&
            lu_jint(r, "device") == device)
            return r;
    }
    return NULL;
}

/* A statistic of device in the report's devices[].stats. */
static inline int64_t lu_jstat(const tally_json_t *root, int device, const char *key)
{
    const tally_json_t *devs = lu_jarr(root, "devices");
    for (size_t i = 0; i < devs->len; i++)
        if (lu_jint(&devs->items[i], "device") == device)
            return lu_jint(lu_jget(&devs->items[i], "stats"), key);
    fail_msg("no device %d in the report", device);
    return 0;
}

/* ---- child processes ------------------------------------------------------ */

typedef struct lu_child {
    pid_t pid;
    int status;    /* from waitpid */
    int exited;    /* WIFEXITED */
    int code;      /* WEXITSTATUS, or -signal */
    char *out;     /* its stdout */
    char *err;     /* its stderr */
    char out_path[300], err_path[300];
} lu_child_t;

/* Start /proc/self/exe --child role with TALLY_CONF=conf and env entries
 * "NAME=value" (NULL-terminated list; may be NULL). RANK, LOCAL_RANK and
 * WORLD_SIZE are cleared unless env sets them. stdout and stderr go to files.
 * The child dies with the process that started it (tu_die_with_parent). */
static inline void lu_child_start(lu_child_t *c, const char *role, const char *conf, const char *const *env)
{
    static int serial;
    memset(c, 0, sizeof *c);
    snprintf(c->out_path, sizeof c->out_path, "%s/child-%d-%d.out", lu_tmpdir(), (int)getpid(), serial);
    snprintf(c->err_path, sizeof c->err_path, "%s/child-%d-%d.err", lu_tmpdir(), (int)getpid(), serial);
    serial++;
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        tu_die_with_parent(parent);
        int o = open(c->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(c->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0)
            _exit(120);
        dup2(o, 1);
        dup2(e, 2);
        close(o);
        close(e);
        unsetenv("RANK");
        unsetenv("LOCAL_RANK");
        unsetenv("WORLD_SIZE");
        setenv("TALLY_CONF", conf, 1);
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execl("/proc/self/exe", "tally-test-child", "--child", role, (char *)NULL);
        _exit(121);
    }
    c->pid = pid;
}

/* Wait for the child and read its output. */
static inline void lu_child_wait(lu_child_t *c)
{
    int st = 0;
    while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR)
        ;
    c->status = st;
    c->exited = WIFEXITED(st);
    c->code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1000;
    c->out = lu_read_file(c->out_path, NULL);
    c->err = lu_read_file(c->err_path, NULL);
    if (!c->out)
        c->out = strdup("");
    if (!c->err)
        c->err = strdup("");
}

static inline void lu_child_run(lu_child_t *c, const char *role, const char *conf, const char *const *env)
{
    lu_child_start(c, role, conf, env);
    lu_child_wait(c);
}

static inline void lu_child_free(lu_child_t *c)
{
    free(c->out);
    free(c->err);
    remove(c->out_path);
    remove(c->err_path);
    c->out = c->err = NULL;
}

/* The child's exit code must be code (fails showing its output). */
#define LU_CHILD_EXIT(c, want)                                                                                    \
    do {                                                                                                          \
        if (!(c)->exited || (c)->code != (want))                                                                  \
            fail_msg("%s:%d: child exited with %d (exited=%d), expected %d\n--- stdout:\n%s\n--- stderr:\n%s",    \
                     __FILE__, __LINE__, (c)->code, (c)->exited, (want), (c)->out, (c)->err);                     \
    } while (0)

/* Run the child role and expect exit 0; exit 77 skips the test with why. */
#define LU_CHILD_OK_OR_SKIP(role, conf, env, why)                                                                 \
    do {                                                                                                          \
        lu_child_t c_;                                                                                            \
        lu_child_run(&c_, role, conf, env);                                                                       \
        if (c_.exited && c_.code == 77) {                                                                         \
            lu_child_free(&c_);                                                                                   \
            SKIP(why);                                                                                            \
        }                                                                                                         \
        LU_CHILD_EXIT(&c_, 0);                                                                                    \
        lu_child_free(&c_);                                                                                       \
    } while (0)

typedef struct lu_role {
    const char *name;
    int (*fn)(void);
} lu_role_t;

/* Run the named role (a child's whole life); its return is the exit code. */
static inline int lu_child_main(const char *name, const lu_role_t *roles)
{
    for (const lu_role_t *r = roles; r->name; r++)
        if (strcmp(r->name, name) == 0)
            return r->fn();
    fprintf(stderr, "unknown child role %s\n", name);
    return 99;
}

/* In a child: stop with a message on stdout and exit code 98 when cond is false. */
#define LU_REQUIRE(cond)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            printf("child requirement failed at %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,         \
                   tally_last_error());                                                                           \
            fflush(stdout);                                                                                       \
            _exit(98);                                                                                            \
        }                                                                                                         \
    } while (0)

/* ---- the ledger suites' common ground ------------------------------------- */

/* Two simulated 80 GiB devices in virtual mode (never touched), weights and
 * optimizer declared persistent. */
#define LU_LEDGER_CONF                                                                                            \
    "backend:host,host_devices:2,host_mode:virtual,host_capacity:80GiB,persistent_tags:weights|optimizer"

static inline void lu_null_sink(void *arg, const char *text, size_t len)
{
    (void)arg;
    (void)text;
    (void)len;
}

/* Each test starts with no tag pushed, no stage open, nothing live and an
 * empty cache, even when an earlier test failed half-way. */
static inline int lu_setup_clean(void **state)
{
    (void)state;
    tally_init();
    tally_set_sink(lu_null_sink, NULL);
    while (tally_tag_pop() == 0)
        ;
    uint32_t open[64];
    int n = tally__stage_open(open, 64);
    for (int i = n - 1; i >= 0; i--)
        tally_stage_end(tally_stage_name(open[i]));
    for (int d = 0; d < tally__g.ndev; d++) {
        tally_ptrmap_t *m = &tally__g.dev[d]->map;
        size_t k = 0, cnt = 0;
        uintptr_t *left = malloc((m->count + 1) * sizeof *left);
        for (k = 0; k <= m->mask && left; k++)
            if (m->slots[k].key)
                left[cnt++] = m->slots[k].key;
        for (k = 0; k < cnt; k++)
            tally_free((void *)left[k]);
        free(left);
    }
    tally_set_sink(NULL, NULL);
    tally_empty_cache(-1);
    return 0;
}

static inline void lu_free_all(void **ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tally_free(ptrs[i]);
}

/* Blocks of one size on device 0, under the current tag and stage, until
 * one of them sits in the pointer map's last slot: the walks over the map
 * (a stage's survivors, the leak report, tally_check's ledger recount) must
 * reach it. Where a block lands depends on its address, so each try frees
 * its blocks and takes another size (4096 + 512 t), and a try ends before
 * the map would grow. Returns how many blocks p holds (all live, each of
 * *size bytes); fails the test when 256 tries put none there. */
static inline size_t lu_fill_to_last_slot(void **p, size_t max, size_t *size)
{
    tally_ptrmap_t *m = &tally__g.dev[0]->map;
    size_t n = 0;
    for (size_t t = 1; t <= 256 && !(m->slots && m->slots[m->mask].key); t++) {
        lu_free_all(p, n);
        n = 0;
        *size = 4096 + 512 * t;
        while (n < max && (m->count + 2) * 2 <= m->mask + 1 && !(m->slots && m->slots[m->mask].key))
            p[n++] = lu_malloc(*size, 0);
    }
    if (!(m->slots && m->slots[m->mask].key))
        fail_msg("no block of 256 tries landed in the pointer map's last slot");
    size_t held = 0; /* the block there is one of these */
    for (size_t i = 0; i < n; i++)
        held += (uintptr_t)p[i] == m->slots[m->mask].key;
    if (held != 1)
        fail_msg("the pointer map's last slot holds a block not taken here");
    return n;
}

/* A ledger suite's main, after its --child dispatch: no rank in the
 * environment, LU_LEDGER_CONF, each test after lu_setup_clean. */
static inline int lu_ledger_run(const char *name, const struct CMUnitTest *tests, size_t n)
{
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    unsetenv("WORLD_SIZE");
    setenv("TALLY_CONF", LU_LEDGER_CONF, 1);
    int failed = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
#define LU_LEDGER_RUN(name, tests) lu_ledger_run(name, tests, sizeof(tests) / sizeof((tests)[0]))
#define LU_T(f) cmocka_unit_test_setup(f, lu_setup_clean)

#endif /* TALLY_LEDGERUTIL_H */
