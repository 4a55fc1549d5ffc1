/* Fuzz target: tally tune's readers of the files a user hands it: the
 * pickle reader (tools/pickle.c) with the PyTorch snapshot rules on top of
 * it, and the alloc_trace of a tally report (tools/tune_input_report.c); an input
 * starting with '{' goes to the report reader, any other to the snapshot's.
 *
 * On every input: no crash, no read outside the input, nothing leaked.
 * On failure: one line (no newline) naming the input. On success: the trace
 * is consistent (every free names an earlier allocation's slot with its
 * size, allocations and frees add up, the live bytes never go negative),
 * and the recorded peak is at least the reserved memory at the start. A
 * violation aborts. */
#include "../../tools/tune.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    unsigned char *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    tune_input_t in;
    char err[1024];
    err[0] = 0;
    int rc;
    if (size && data[0] == '{') {
        rc = tune_report_parse((const char *)copy, size, "input", -1, &in, err, sizeof err);
        free(copy);
    } else {
        rc = tune_snapshot_parse(copy, size, "input", &in, err, sizeof err);
    }
    if (rc) {
        if (!err[0] || strchr(err, '\n') || strncmp(err, "input", 5) != 0)
            abort();
        tune_input_free(&in);
        return 0;
    }
    const trace_t *t = &in.trace;
    uint64_t *sizes = calloc(t->nalloc ? t->nalloc : 1, sizeof *sizes);
    if (!sizes)
        abort();
    size_t allocs = 0, frees = 0;
    uint64_t live = 0;
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event_t *e = &t->ev[i];
        if (e->op == 'e') { /* a release (segment_free): carries nothing */
            if (e->size != 0)
                abort();
            continue;
        }
        if (e->slot >= t->nalloc || e->stream >= t->nstreams)
            abort();
        if (e->op == 'a') {
            sizes[e->slot] = e->size + 1; /* 0: not live */
            live += e->size;
            allocs++;
        } else {
            if (sizes[e->slot] != e->size + 1 || live < e->size)
                abort();
            sizes[e->slot] = 0;
            live -= e->size;
            frees++;
        }
    }
    if (allocs != t->nalloc || frees != t->nfree || in.prelive > t->nalloc ||
        (in.has_recorded && in.recorded_peak < in.recorded_start))
        abort();
    /* The recorded state: one block per allocation placed first, each its own slot. */
    if (in.start.known && in.start.nlive != in.prelive)
        abort();
    for (size_t i = 0; in.start.known && i < in.start.nlive; i++)
        if (in.start.live[i].slot != i || in.start.live[i].size == 0)
            abort();
    free(sizes);
    tune_input_free(&in);
    return 0;
}
