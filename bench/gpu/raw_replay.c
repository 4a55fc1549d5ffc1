/* Replays allocation traces straight against CUDA, without tally: raw
 * cudaMalloc / cudaFree, and raw cudaMallocAsync / cudaFreeAsync on the
 * device's default pool. The baselines for tally over cuda and over async
 * (bench/gpu/run_all.sh runs both). For each trace and mode it prints
 * nanoseconds per operation (a timed pass) and peak reserved bytes (a second
 * pass sampling cudaMemGetInfo after every allocation for cudaMalloc; the
 * pool's reserved high-water mark for cudaMallocAsync).
 *
 * usage: raw_replay malloc|async TRACE.csv... */
#include "../trace.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* One pass; when sample is set, track the device's used bytes. Returns 0,
 * or -1 when an allocation fails (the trace does not fit). */
static int run(const trace_t *t, bool async, cudaStream_t *streams, bool sample, double *ns, uint64_t *peak)
{
    void **live = calloc(t->nalloc, sizeof *live);
    size_t free0 = 0, total = 0, f = 0;
    cudaMemGetInfo(&free0, &total);
    uint64_t high = 0;
    int rc = 0;
    double t0 = now_ns();
    for (size_t i = 0; i < t->nev; i++) {
        const trace_event_t *e = &t->ev[i];
        cudaStream_t s = streams[e->stream];
        if (e->op == 'a') {
            cudaError_t err = async ? cudaMallocAsync(&live[e->slot], e->size, s) : cudaMalloc(&live[e->slot], e->size);
            if (err != cudaSuccess) {
                cudaGetLastError();
                rc = -1;
                break;
            }
            if (sample) {
                cudaMemGetInfo(&f, &total);
                if (free0 - f > high)
                    high = free0 - f;
            }
        } else if (live[e->slot]) {
            if (async)
                cudaFreeAsync(live[e->slot], s);
            else
                cudaFree(live[e->slot]);
            live[e->slot] = NULL;
        }
    }
    cudaDeviceSynchronize();
    *ns = (now_ns() - t0) / (double)t->nev;
    for (size_t k = 0; k < t->nalloc; k++)
        if (live[k])
            async ? cudaFreeAsync(live[k], streams[0]) : cudaFree(live[k]);
    cudaDeviceSynchronize();
    free(live);
    *peak = high;
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "malloc") && strcmp(argv[1], "async"))) {
        fprintf(stderr, "usage: raw_replay malloc|async TRACE.csv...\n");
        return 2;
    }
    bool async = strcmp(argv[1], "async") == 0;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skip: no CUDA device\n");
        return 0;
    }
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    printf("%-36s %-6s %10s %16s\n", "trace", "mode", "ns/op", "peak reserved");
    for (int a = 2; a < argc; a++) {
        trace_t t;
        char err[512];
        if (trace_load(argv[a], &t, err, sizeof err)) {
            fprintf(stderr, "raw_replay: %s\n", err);
            return 1;
        }
        cudaStream_t streams[64] = {0};
        for (size_t s = 1; s < t.nstreams && s < 64; s++)
            cudaStreamCreate(&streams[s]);
        double ns = 0, ns2 = 0;
        uint64_t peak = 0, unused = 0;
        int rc = run(&t, async, streams, false, &ns, &unused);
        if (rc == 0 && async) {
            uint64_t zero = 0;
            cudaMemPoolTrimTo(pool, 0);
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
            rc = run(&t, async, streams, false, &ns2, &unused);
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &peak);
            cudaMemPoolTrimTo(pool, 0);
        } else if (rc == 0) {
            rc = run(&t, async, streams, true, &ns2, &peak);
        }
        if (rc)
            printf("%-36s %-6s %10s %16s\n", t.name, argv[1], "-", "does not fit");
        else
            printf("%-36s %-6s %10.1f %16llu\n", t.name, argv[1], ns, (unsigned long long)peak);
        for (size_t s = 1; s < t.nstreams && s < 64; s++)
            cudaStreamDestroy(streams[s]);
        trace_free(&t);
    }
    return 0;
}
