/* tally tune's replays (tune.h): one forked process per candidate, at most
 * `jobs` at a time. tally's options are process-wide and most are fixed at
 * initialisation, so each configuration gets a fresh allocator in its own
 * process; the trace is shared copy-on-write. Children write their results
 * into a shared anonymous mapping and leave with _exit. */
#include "tune.h"

#include <tally.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct sampler {
    int64_t *out;
} sampler_t;

/* Reserved bytes after each event: the host backend's used capacity. */
static void sample(void *arg, size_t i)
{
    sampler_t *s = arg;
    size_t free_b = 0, total = 0;
    tally_mem_get_info(0, &free_b, &total);
    s->out[i] = (int64_t)(total - free_b);
}

/* The replays' diagnostics (an OOM report when a candidate does not fit)
 * would bury the table: the row says it. */
static void discard(void *arg, const char *text, size_t len)
{
    (void)arg, (void)text, (void)len;
}

/* In the child: configure, replay, fill r (and series when given). */
static void child(const trace_t *t, uint64_t capacity, tune_row_t *r, int64_t *series)
{
    char conf[512];
    unsetenv("TALLY_CONF");
    tally_set_sink(discard, NULL);
    snprintf(conf, sizeof conf,
             "backend:host,host_mode:virtual,host_devices:1,host_capacity:%llu,leak_report:off,stage_report:false,"
             "ledger:false",
             (unsigned long long)capacity);
    if (tally_configure(conf) || (r->setting[0] && tally_configure(r->setting)) || tally_init()) {
        snprintf(r->error, sizeof r->error, "%s", tally_last_error());
        return;
    }
    void **ptrs = calloc(t->nalloc ? t->nalloc : 1, sizeof *ptrs);
    if (!ptrs) {
        snprintf(r->error, sizeof r->error, "out of memory");
        return;
    }
    sampler_t s = {series};
    double t0 = now_s();
    r->oom_event = trace_run(t, ptrs, series ? sample : NULL, &s);
    r->seconds = now_s() - t0;
    tally_stats_t st;
    if (tally_get_stats(0, &st)) {
        snprintf(r->error, sizeof r->error, "tally_get_stats: %s", tally_last_error());
        return;
    }
    r->peak_reserved = st.reserved_bytes[0].peak;
    r->num_device_alloc = st.num_device_alloc;
    r->backend_calls = st.num_device_alloc + st.num_device_free;
    r->ok = true;
}

int tune_run(const trace_t *t, uint64_t capacity, tune_row_t *rows, size_t nrows, int jobs, bool quiet,
             const size_t *want, size_t nwant, tune_series_t *series, char *err, size_t errlen)
{
    size_t row_bytes = nrows * sizeof *rows;
    size_t ser_bytes = nwant * (t->nev ? t->nev : 1) * sizeof(int64_t);
    size_t bytes = row_bytes + ser_bytes;
    unsigned char *shared = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return snprintf(err, errlen, "mmap of %zu bytes: %s", bytes, strerror(errno)), -1;
    tune_row_t *out = (tune_row_t *)shared;
    int64_t *ser = (int64_t *)(shared + row_bytes);
    memcpy(out, rows, row_bytes);
    pid_t *pids = calloc(nrows ? nrows : 1, sizeof *pids);
    if (!pids) {
        munmap(shared, bytes);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    bool tty = !quiet && isatty(2);
    double t0 = now_s();
    size_t next = 0, done = 0;
    int running = 0, rc = 0;
    fflush(NULL);
    while (done < nrows) {
        while (!rc && running < jobs && next < nrows) {
            int64_t *mine = NULL;
            for (size_t w = 0; w < nwant; w++)
                if (want[w] == next)
                    mine = ser + w * t->nev;
            pid_t pid = fork();
            if (pid < 0) {
                snprintf(err, errlen, "fork: %s", strerror(errno));
                rc = -1;
                break;
            }
            if (pid == 0) {
                child(t, capacity, &out[next], mine);
                _exit(0);
            }
            pids[next++] = pid;
            running++;
        }
        if (!running)
            break;
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            snprintf(err, errlen, "wait: %s", strerror(errno));
            rc = -1;
            break;
        }
        for (size_t i = 0; i < next; i++)
            if (pids[i] == pid) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    snprintf(out[i].error, sizeof out[i].error, "the replay process %s %d",
                             WIFSIGNALED(status) ? "died of signal" : "exited with",
                             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
                if (out[i].error[0])
                    out[i].ok = false;
            }
        running--;
        done++;
        if (tty)
            fprintf(stderr, "\rtally tune: %zu/%zu settings replayed (%d worker%s, %.1f s)", done, nrows, jobs,
                    jobs == 1 ? "" : "s", now_s() - t0);
    }
    if (!quiet)
        fprintf(stderr, "%stally tune: %zu settings replayed, %zu events each, %d worker%s, %.2f s\n", tty ? "\r" : "",
                done, t->nev, jobs, jobs == 1 ? "" : "s", now_s() - t0);
    memcpy(rows, out, row_bytes);
    for (size_t w = 0; series && w < nwant; w++) {
        series[w].n = t->nev;
        series[w].reserved = malloc((t->nev ? t->nev : 1) * sizeof(int64_t));
        if (series[w].reserved)
            memcpy(series[w].reserved, ser + w * t->nev, t->nev * sizeof(int64_t));
    }
    free(pids);
    munmap(shared, bytes);
    return rc;
}
