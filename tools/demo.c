/* The main job (`make demo`): a small training-like workload on tally's
 * default backend (cuda when a GPU is visible, else simulated host devices),
 * then everything tally knows about it: the memory_summary table, the ledger
 * by tag and stage, the stage history, and at exit the leak report.
 *
 * The workload: stage "load" builds a 12-layer model (tag weights), and by
 * mistake a second copy (tag model-init) that is never freed; stage "train"
 * runs steps whose activations are allocated layer by layer and freed in
 * reverse order, gradients go through a second stream (record_stream), and
 * the optimizer state (tag optimizer) appears at the first step; stage
 * "eval" runs forward passes. Each step sleeps in place of computing, so
 * the stages take real time. The demo says what the user is looking at and
 * what to try next; its own settings (DEMO_CONF) give way to TALLY_CONF. */
#include "tally.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LAYERS 12
#define STEPS 20
#define MiB ((size_t)1 << 20)

/* The demo's own configuration; TALLY_CONF is applied again over it, so
 * any key the user sets there wins. */
#define DEMO_CONF "persistent_tags:weights|optimizer,release_at_stage_end:true,leak_report:full"

static const char intro[] =
    "What runs (tools/demo.c): stage load builds a 12-layer model (tag weights) and, by\n"
    "mistake, a second copy (tag model-init) that is never freed: the leak planted for\n"
    "tally to find. Stage train runs %d steps (tags activations and gradients, freed each\n"
    "step; tag optimizer, made at the first step and kept), stage eval runs forward passes.\n"
    "weights and optimizer are persistent tags: they outlive their stage by design, so the\n"
    "stage reports leave them out. Each step sleeps %d ms in place of computing.\n"
    "Settings: %s (TALLY_CONF overrides any of them).\n\n";

static const char ledger_note[] =
    "The ledger: live bytes by tag and stage. \"home device none\": no device is this\n"
    "process's own (home_device:auto takes LOCAL_RANK, unset here); with home_device:N,\n"
    "memory on any other device is marked foreign, as a stray checkpoint load would be.\n";

/* The next steps, with paths that work from any folder: the build folder
 * (B, the one holding bin/demo) and the source tree (S, B's parent). Their
 * files go to B/demo/ (made here; build folders are ignored by git), not to
 * the folder the demo runs in. */
static void print_next_steps(void)
{
    char exe[2048], b[2048] = "build", s[2048] = ".";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/'); /* .../B/bin/demo */
        if (slash && slash > exe) {
            *slash = 0;
            slash = strrchr(exe, '/');
            if (slash && strcmp(slash, "/bin") == 0) {
                *slash = 0;
                snprintf(b, sizeof b, "%s", exe);
                slash = strrchr(exe, '/');
                if (slash && slash > exe) {
                    *slash = 0;
                    snprintf(s, sizeof s, "%s", exe);
                }
            }
        }
    }
    /* Run from the source tree (make demo): the paths relative to it. */
    char cwd[2048], rel[2048];
    size_t sl = strlen(s);
    if (getcwd(cwd, sizeof cwd) && strcmp(cwd, s) == 0 && strncmp(b, s, sl) == 0 && b[sl] == '/') {
        snprintf(rel, sizeof rel, "%s", b + sl + 1);
        snprintf(b, sizeof b, "%s", rel);
        snprintf(s, sizeof s, ".");
    }
    char out[2100];
    snprintf(out, sizeof out, "%s/demo", b);
    mkdir(out, 0777); /* it may be there already */
    printf("\nAt exit the leak report (leak_report) names the model-init copy. Next (the files go to %s/):\n"
           "  TALLY_CONF=report_path:%s/demo.json,timeline:true %s/bin/demo   (a JSON report)\n"
           "  %s/bin/tally plot %s/demo.json -o %s/demo.html     (memory over time, by tag)\n"
           "  %s/bin/tally summary %s/demo.json               (the table above, from the report)\n"
           "  PYTHONPATH=%s/python python3 -m tally snapshot %s/demo.json  (for PyTorch's memory visualiser;\n"
           "    after pip install ./python: python3 -m tally snapshot %s/demo.json)\n"
           "docs/reports.md explains every report; docs/configuration.md every TALLY_CONF key.\n",
           out, out, b, b, out, out, b, out, s, out, out);
}

/* Stands in for a step's computation, so stages take real time. */
static void compute(int ms)
{
    struct timespec t = {0, (long)ms * 1000000L};
    nanosleep(&t, NULL);
}

/* While tally starts, its diagnostics lines are held here: passed on when
 * it starts, dropped when it fails (the demo then says why, once). */
static char held[4096];
static size_t held_len;

static void hold(void *arg, const char *text, size_t len)
{
    (void)arg;
    if (len > sizeof held - held_len)
        len = sizeof held - held_len;
    memcpy(held + held_len, text, len);
    held_len += len;
}

/* The demo's settings, then TALLY_CONF again on top (before initialisation
 * every key may be set), so the user's keys win; then tally starts. */
static int start_tally(void)
{
    tally_set_sink(hold, NULL);
    int rc = tally_configure(DEMO_CONF);
    const char *user = getenv("TALLY_CONF");
    if (rc == 0 && user && *user)
        tally_configure(user); /* already checked when tally read it */
    held_len = 0;              /* the second reading's lines repeat the first's */
    if (rc == 0)
        rc = tally_init();
    tally_set_sink(NULL, NULL);
    if (rc != 0) {
        fprintf(stderr, "demo: %s\n", tally_last_error());
        return rc;
    }
    fwrite(held, 1, held_len, stderr);
    return 0;
}

static void out(void *arg, const char *text, size_t len)
{
    fwrite(text, 1, len, (FILE *)arg);
}

static void *must(size_t size, void *stream)
{
    void *p = tally_malloc(size, 0, stream);
    if (!p) {
        fprintf(stderr, "demo: allocation of %zu bytes failed: %s\n", size, tally_last_error());
        exit(1);
    }
    return p;
}

/* Layer l's weight matrix and bias; sizes vary like a real model's. */
static size_t weight_size(int l)
{
    return (l % 3 == 0 ? 9 : 4) * MiB + 4096 * (size_t)l;
}

static void build_model(void **w, void **b)
{
    for (int l = 0; l < LAYERS; l++) {
        w[l] = must(weight_size(l), NULL);
        b[l] = must(3072 + 512 * (size_t)l, NULL);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* interleave with tally's stderr lines */
    if (start_tally() != 0)
        return 1;
    printf("tally %s, backend %s, %d device(s)\n\n", tally_version(), tally_backend_name(), tally_device_count());
    printf(intro, STEPS, 10, DEMO_CONF);
    void *grad_stream = (void *)0x2; /* host backend: any non-NULL value names a stream */
    if (strcmp(tally_backend_name(), "host") != 0)
        grad_stream = NULL;

    void *w[LAYERS], *b[LAYERS], *w2[LAYERS], *b2[LAYERS], *opt[2 * LAYERS];
    tally_stage_begin("load");
    tally_tag_push("weights");
    build_model(w, b);
    tally_tag_pop();
    tally_tag_push("model-init"); /* the bug: a second instance nobody frees */
    build_model(w2, b2);
    tally_tag_pop();
    tally_tag_push("scratch");
    void *staging = must(64 * MiB, NULL); /* checkpoint staging buffer */
    compute(50); /* reading the checkpoint */
    tally_free(staging);
    tally_tag_pop();
    tally_stage_end("load");

    tally_stage_begin("train");
    for (int step = 0; step < STEPS; step++) {
        void *act[LAYERS], *grad[LAYERS];
        tally_tag_push("activations");
        for (int l = 0; l < LAYERS; l++)
            act[l] = must(2 * MiB + (size_t)(l % 4) * 700 * 1024 + (size_t)step * 512, NULL);
        tally_tag_pop();
        tally_tag_push("gradients");
        for (int l = LAYERS - 1; l >= 0; l--) {
            grad[l] = must(weight_size(l), NULL);
            /* The bucket is reduced on another stream before it is reused. */
            tally_record_stream(grad[l], grad_stream);
            tally_free(act[l]);
        }
        tally_tag_pop();
        if (step == 0) {
            tally_tag_push("optimizer");
            for (int l = 0; l < LAYERS; l++) {
                opt[2 * l] = must(weight_size(l), NULL);
                opt[2 * l + 1] = must(weight_size(l), NULL);
            }
            tally_tag_pop();
        }
        for (int l = 0; l < LAYERS; l++)
            tally_free(grad[l]);
        compute(10);
    }
    tally_stage_end("train");

    tally_stage_begin("eval");
    tally_tag_push("activations");
    for (int i = 0; i < 5; i++) {
        void *x = must(6 * MiB, NULL), *y = must(3 * MiB, NULL);
        compute(10);
        tally_free(y);
        tally_free(x);
    }
    tally_tag_pop();
    tally_stage_end("eval");

    printf("tally_check: %s\n\n", tally_check() == 0 ? "all invariants hold" : tally_last_error());
    tally_write_summary(0, 0, out, stdout);
    printf("\n%s\n", ledger_note);
    tally_write_ledger(out, stdout);
    printf("\n");
    tally_stats_t s;
    tally_get_stats(0, &s);
    printf("largest free block %lld bytes, utilisation (peak allocated / peak reserved) %.3f\n",
           (long long)s.largest_free_block, s.utilisation);
    print_next_steps();
    fflush(stdout);

    for (int l = 0; l < LAYERS; l++) {
        tally_free(w[l]);
        tally_free(b[l]);
        tally_free(opt[2 * l]);
        tally_free(opt[2 * l + 1]);
    }
    /* w2 / b2 (tag model-init) stay live: the leak report at exit names them. */
    return 0;
}
