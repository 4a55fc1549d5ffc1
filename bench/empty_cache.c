/* tally-empty-cache: what stays mapped after an empty_cache in the middle of
 * a job, tally against PyTorch's expandable segments (docs/benchmarks.md,
 * run Z).
 *
 *   TALLY_CONF=... tally-empty-cache [--cuts N] TRACE.csv|DIR ...
 *
 * For each trace and each cut k/N of its events (k = 1 .. N-1; N = 10 by
 * default), a fresh child replays the events before the cut through tally
 * (TALLY_CONF, usually the cuda backend on the CUDA stand-in with
 * expandable_segments:true), calls tally_empty_cache(0) and reports the
 * reserved bytes left; the model of PyTorch's expandable segments
 * (tools/pt_expand.c) replays the same events with an empty_cache ('e') at
 * the cut. What stays is memory live blocks hold plus what they pin: pages
 * of a physical handle are unmapped only together (CUDA's cuMemUnmap takes
 * whole mappings), so a live block on part of a handle keeps all of it.
 * PyTorch's handles are its 20 MiB pages; tally's are what
 * expandable_handle_grid_mb makes them.
 *
 * One row per trace: the cuts, the sum over them of what stays (tally,
 * PyTorch), their ratio, and the worst cut's ratio. Exit status 1 if a
 * replay failed. */
#include "../tools/pt_expand.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024.0 * 1024.0)

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* In a child: replay t's first n events, empty the cache, write the
 * reserved bytes left to fd. */
static int tally_after(const trace_t *t, size_t n, int64_t *out)
{
    int fds[2];
    if (pipe(fds))
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fds[0]);
        const char *conf = getenv("TALLY_CONF");
        if (conf && *conf && tally_configure(conf)) {
            fprintf(stderr, "tally-empty-cache: TALLY_CONF: %s\n", tally_last_error());
            _exit(1);
        }
        trace_t head = *t;
        head.nev = n;
        void **ptrs = calloc(t->nalloc ? t->nalloc : 1, sizeof *ptrs);
        if (!ptrs || trace_run(&head, ptrs, NULL, NULL) >= 0) {
            fprintf(stderr, "tally-empty-cache: %s: the replay was refused: %s\n", t->name, tally_last_error());
            _exit(1);
        }
        tally_empty_cache(0);
        tally_stats_t s;
        if (tally_get_stats(0, &s))
            _exit(1);
        int64_t left = s.reserved_bytes[TALLY_POOL_ALL].current;
        _exit(write(fds[1], &left, sizeof left) == (ssize_t)sizeof left ? 0 : 1);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], out, sizeof *out);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == (ssize_t)sizeof *out ? 0 : -1;
}

/* PyTorch's model with an empty_cache after t's first n events: the mapped
 * bytes just after it. */
static int pytorch_after(const trace_t *t, size_t n, int64_t *out)
{
    trace_t e = *t;
    e.ev = malloc((t->nev + 1) * sizeof *e.ev);
    int64_t *reserved = malloc((t->nev + 1) * sizeof *reserved);
    int rc = -1;
    if (e.ev && reserved) {
        memcpy(e.ev, t->ev, n * sizeof *e.ev);
        memset(&e.ev[n], 0, sizeof e.ev[n]);
        e.ev[n].op = 'e';
        memcpy(e.ev + n + 1, t->ev + n, (t->nev - n) * sizeof *e.ev);
        e.nev = t->nev + 1;
        ptx_opts_t o = {(uint64_t)80 << 30, 0};
        ptx_result_t r;
        char err[256];
        if (ptx_replay(&e, &o, NULL, &r, reserved, err, sizeof err) == 0) {
            *out = reserved[n];
            rc = 0;
        } else {
            fprintf(stderr, "tally-empty-cache: %s: PyTorch's model: %s\n", t->name, err);
        }
    }
    free(e.ev);
    free(reserved);
    return rc;
}

static int run(const char *path, int cuts, double *sum_ratio, int *traces)
{
    char err[1400];
    trace_t t;
    if (trace_load(path, &t, err, sizeof err)) {
        fprintf(stderr, "tally-empty-cache: %s\n", err);
        return 1;
    }
    double tally_sum = 0, pt_sum = 0, worst = 0;
    int worst_cut = 0;
    for (int k = 1; k < cuts; k++) {
        size_t n = t.nev * (size_t)k / (size_t)cuts;
        int64_t a, b;
        if (tally_after(&t, n, &a) || pytorch_after(&t, n, &b)) {
            trace_free(&t);
            return 1;
        }
        tally_sum += (double)a;
        pt_sum += (double)b;
        double r = b > 0 ? (double)a / (double)b : 1.0;
        if (r > worst) {
            worst = r;
            worst_cut = k;
        }
    }
    double ratio = pt_sum > 0 ? tally_sum / pt_sum : 1.0;
    printf("| %s | %d | %.1f | %.1f | %.3f | %.3f (%d/%d) |\n", t.name, cuts - 1, tally_sum / MiB, pt_sum / MiB, ratio,
           worst, worst_cut, cuts);
    *sum_ratio += ratio;
    ++*traces;
    trace_free(&t);
    return 0;
}

int main(int argc, char **argv)
{
    int cuts = 10, first = 1;
    if (argc > 2 && !strcmp(argv[1], "--cuts")) {
        cuts = atoi(argv[2]);
        first = 3;
    }
    if (first >= argc || cuts < 2 || cuts > 1000) {
        fprintf(stderr, "usage: tally-empty-cache [--cuts N (2..1000)] TRACE.csv|DIR ...\n");
        return 2;
    }
    printf("| trace | cuts | tally: MiB reserved after empty_cache, summed over the cuts | PyTorch's expandable segments "
           "(model) | tally / PyTorch | worst cut (k/N) |\n|---|---:|---:|---:|---:|---|\n");
    int failures = 0, traces = 0;
    double sum_ratio = 0;
    for (int i = first; i < argc; i++) {
        if (!is_dir(argv[i])) {
            failures += run(argv[i], cuts, &sum_ratio, &traces);
            continue;
        }
        char **list, err[1400];
        int n = trace_dir_list(argv[i], &list, err, sizeof err);
        if (n < 0) {
            fprintf(stderr, "tally-empty-cache: %s\n", err);
            failures++;
            continue;
        }
        for (int k = 0; k < n; k++) {
            failures += run(list[k], cuts, &sum_ratio, &traces);
            free(list[k]);
        }
        free(list);
    }
    if (traces)
        printf("\nMean of tally / PyTorch over the %d traces: %.3f\n", traces, sum_ratio / traces);
    return failures ? 1 : 0;
}
