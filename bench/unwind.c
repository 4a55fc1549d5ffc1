/* Cost of allocation sites per allocation: tally_malloc + tally_free pairs
 * (4 KiB, one thread) called 16 frames below main, with no backtrace, then
 * backtrace_depth:16 with each unwinder (glibc's backtrace, libunwind's
 * unw_backtrace, the frame-pointer walk). This file is built with frame
 * pointers so that the frame-pointer walk goes the whole 16 frames.
 * Prints a Markdown table: CPU ns per pair (median of ROUNDS rounds) and
 * the unwinding cost per allocation (pair minus the pair without sites). */
#include "tally.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEPTH 16
#define PAIRS 100000
#define ROUNDS 7
/* --quick (make bench-quick): a few rounds of fewer pairs, to see it runs. */
static int pairs = PAIRS, rounds = ROUNDS;

static double cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct text {
    char buf[1 << 16];
    size_t len;
} text_t;

static void collect(void *arg, const char *s, size_t n)
{
    text_t *t = arg;
    if (t->len + n < sizeof t->buf) {
        for (size_t i = 0; i < n; i++)
            t->buf[t->len++] = s[i];
        t->buf[t->len] = 0;
    }
}

/* Frames the leak report shows for one block allocated here. */
static int frames_recorded(void)
{
    static text_t t;
    t.len = 0;
    t.buf[0] = 0;
    void *p = tally_malloc(4096, 0, NULL);
    tally_write_leaks(1, collect, &t);
    tally_free(p);
    int n = 0;
    for (const char *s = t.buf; (s = strstr(s, "tally:     #")); s++)
        n++;
    return n;
}

static int frames;

__attribute__((noinline)) static double timed_pairs(void)
{
    frames = frames_recorded();
    double r[ROUNDS];
    for (int k = 0; k < rounds; k++) {
        double t = cpu_ns();
        for (int i = 0; i < pairs; i++) {
            void *p = tally_malloc(4096, 0, NULL);
            if (!p) {
                fprintf(stderr, "unwind: tally_malloc: %s\n", tally_last_error());
                exit(1);
            }
            tally_free(p);
        }
        r[k] = (cpu_ns() - t) / pairs;
    }
    qsort(r, (size_t)rounds, sizeof r[0], cmp);
    return r[rounds / 2];
}

__attribute__((noinline)) static double deep(int d)
{
    double v = d ? deep(d - 1) : timed_pairs();
    __asm__ volatile("" ::: "memory"); /* not a tail call: the frame stays */
    return v;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--quick")) {
        pairs = 2000;
        rounds = 3;
    } else if (argc != 1) {
        fprintf(stderr, "usage: unwind [--quick]\n");
        return 2;
    }
    static const char *const confs[][2] = {
        {"no backtrace", "backtrace_depth:0"},
        {"glibc backtrace", "backtrace_depth:16,unwinder:glibc"},
        {"libunwind unw_backtrace (auto)", "backtrace_depth:16,unwinder:auto"},
        {"frame pointers", "backtrace_depth:16,unwinder:fp"},
    };
    if (tally_configure("backend:host,host_mode:virtual,leak_report:off,stage_report:false")) {
        fprintf(stderr, "unwind: %s\n", tally_last_error());
        return 1;
    }
    printf("| sites | frames recorded | CPU ns per allocate+free pair | unwinding per allocation |\n"
           "|---|---:|---:|---:|\n");
    double base = 0;
    for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
        if (tally_configure(confs[i][1])) {
            fprintf(stderr, "unwind: %s\n", tally_last_error());
            return 1;
        }
        double ns = deep(DEPTH);
        if (i == 0)
            base = ns;
        if (i)
            printf("| %s (`%s`) | %d | %.0f | %.0f ns |\n", confs[i][0], confs[i][1], frames, ns, ns - base);
        else
            printf("| %s (`%s`) | 0 | %.0f | - |\n", confs[i][0], confs[i][1], ns);
    }
    return 0;
}
