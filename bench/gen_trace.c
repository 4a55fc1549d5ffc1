/* gen_trace: a synthetic allocation trace of transformer training at LLaMA
 * 7B / 13B shapes, in the replay format (op,id,size,stream). The model, the
 * formulas and what is left out are in bench/README.md ("Synthetic traces").
 *
 *   gen_trace --model 7b|13b [--seq N] [--batch N] [--steps N] [--shards Z]
 *             [--bucket-mib N] [--inflight N] [--cross-free 1] --out FILE
 *
 * Stream 0 is the compute stream; stream 1 the communication stream that the
 * gradient buckets are allocated on. With --cross-free 1 each bucket is freed
 * from the compute stream (its free line names stream 0): a block freed from
 * another stream than its own, which goes back to its own stream's pool. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct model {
    const char *name;
    uint64_t h, layers, heads, ffn, vocab;
} model_t;

static const model_t models[] = {
    {"7b", 4096, 32, 32, 11008, 32000},
    {"13b", 5120, 40, 40, 13824, 32000},
};

/* ---- the writer: ids, sizes, live bytes ---------------------------------- */

static FILE *out;
static uint64_t *sizes;
static uint8_t *streams;
static bool *live;
static size_t nids, capids;
static uint64_t live_bytes, peak_live, nevents;

static void die(const char *msg)
{
    fprintf(stderr, "gen_trace: %s\n", msg);
    exit(2);
}

static size_t A(uint64_t size, int stream)
{
    if (nids + 1 >= capids) {
        capids = capids ? capids * 2 : 4096;
        sizes = realloc(sizes, capids * sizeof *sizes);
        streams = realloc(streams, capids * sizeof *streams);
        live = realloc(live, capids * sizeof *live);
        if (!sizes || !streams || !live)
            die("out of memory");
    }
    size_t id = ++nids;
    sizes[id] = size;
    streams[id] = (uint8_t)stream;
    live[id] = true;
    live_bytes += size;
    if (live_bytes > peak_live)
        peak_live = live_bytes;
    nevents++;
    fprintf(out, "a,%zu,%llu,%d\n", id, (unsigned long long)size, stream);
    return id;
}

static bool cross_free; /* buckets (stream 1) freed from stream 0 */

static void F(size_t id)
{
    if (!id || id > nids || !live[id])
        die("internal error: free of a block that is not live");
    live[id] = false;
    live_bytes -= sizes[id];
    nevents++;
    fprintf(out, "f,%zu,%llu,%d\n", id, (unsigned long long)sizes[id], cross_free && streams[id] == 1 ? 0 : streams[id]);
}

/* ---- the model ------------------------------------------------------------ */

enum { W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_FFN_NORM, W_1, W_3, W_2, W_PER_LAYER };

typedef struct run {
    model_t m;
    uint64_t seq, batch, steps, shards, bucket, inflight;
    uint64_t tokens; /* batch * seq */
    size_t nparams;
    uint64_t *param_bytes; /* bf16 bytes of each parameter, in creation order */
    size_t *grad;          /* live gradient id per parameter, 0 if none */
    size_t *opt_m, *opt_v; /* optimizer states, allocated at the first step */
    /* gradient buckets on stream 1 */
    uint64_t bucket_fill;
    size_t buckets[64];
    int nbuckets;
} run_t;

#define BF16 2
#define FP32 4

static size_t param_index_embedding(void)
{
    return 0;
}
static size_t param_index_layer(uint64_t l, int w)
{
    return 1 + (size_t)l * W_PER_LAYER + (size_t)w;
}
static size_t param_index_final_norm(const run_t *r)
{
    return 1 + (size_t)r->m.layers * W_PER_LAYER;
}
static size_t param_index_lm_head(const run_t *r)
{
    return param_index_final_norm(r) + 1;
}

/* The gradient of parameter i appears (set_to_none: a fresh allocation every
 * step) and joins the current bucket; a full bucket is copied into a flat
 * buffer on the communication stream, at most `inflight` of which are live. */
static void grad_ready(run_t *r, size_t i)
{
    r->grad[i] = A(r->param_bytes[i], 0);
    r->bucket_fill += r->param_bytes[i];
    if (r->bucket_fill >= r->bucket) {
        if ((uint64_t)r->nbuckets == r->inflight) {
            F(r->buckets[0]);
            memmove(r->buckets, r->buckets + 1, (size_t)(r->nbuckets - 1) * sizeof r->buckets[0]);
            r->nbuckets--;
        }
        r->buckets[r->nbuckets++] = A(r->bucket_fill, 1);
        r->bucket_fill = 0;
    }
}

static void buckets_drain(run_t *r)
{
    if (r->bucket_fill) {
        r->buckets[r->nbuckets++] = A(r->bucket_fill, 1);
        r->bucket_fill = 0;
    }
    for (int k = 0; k < r->nbuckets; k++)
        F(r->buckets[k]);
    r->nbuckets = 0;
}

typedef struct saved {
    size_t x, rstd1, n1, q, k, v, o, lse, h1, rstd2, n2, g, u, m;
} saved_t;

static void step(run_t *r, saved_t *sv, int step_no)
{
    const uint64_t T = r->tokens, h = r->m.h, f = r->m.ffn, V = r->m.vocab, L = r->m.layers;
    const uint64_t act = T * h * BF16, actf = T * f * BF16, rstd = T * FP32;
    /* forward */
    size_t ids = A(T * 8, 0); /* int64 token ids */
    size_t x = A(act, 0);     /* embedding output = input of layer 0 */
    for (uint64_t l = 0; l < L; l++) {
        saved_t *s = &sv[l];
        s->x = x;
        s->rstd1 = A(rstd, 0);
        s->n1 = A(act, 0);
        s->q = A(act, 0);
        s->k = A(act, 0);
        s->v = A(act, 0);
        s->o = A(act, 0);
        s->lse = A(r->batch * r->m.heads * r->seq * FP32, 0);
        size_t proj = A(act, 0);
        s->h1 = A(act, 0);
        F(proj);
        s->rstd2 = A(rstd, 0);
        s->n2 = A(act, 0);
        s->g = A(actf, 0);
        s->u = A(actf, 0);
        size_t sg = A(actf, 0);
        s->m = A(actf, 0);
        F(sg);
        size_t down = A(act, 0);
        x = A(act, 0); /* layer output: h1 + down */
        F(down);
    }
    size_t rstdf = A(rstd, 0);
    size_t nf = A(act, 0);
    size_t logits = A(T * V * BF16, 0);
    size_t logits32 = A(T * V * FP32, 0);
    size_t lsm = A(T * V * FP32, 0);
    F(logits32);
    size_t loss = A(FP32, 0);
    /* backward */
    size_t dl32 = A(T * V * FP32, 0);
    F(lsm);
    size_t dl = A(T * V * BF16, 0);
    F(dl32);
    grad_ready(r, param_index_lm_head(r));
    size_t dnf = A(act, 0);
    F(dl);
    F(logits);
    F(nf);
    size_t dy = A(act, 0);
    grad_ready(r, param_index_final_norm(r));
    F(dnf);
    F(rstdf);
    F(x);
    for (uint64_t l = L; l-- > 0;) {
        saved_t *s = &sv[l];
        size_t dm = A(actf, 0);
        grad_ready(r, param_index_layer(l, W_2));
        F(s->m);
        size_t dg = A(actf, 0), du = A(actf, 0);
        F(dm);
        F(s->u);
        F(s->g);
        size_t dn2 = A(act, 0);
        grad_ready(r, param_index_layer(l, W_3));
        grad_ready(r, param_index_layer(l, W_1));
        F(du);
        F(dg);
        F(s->n2);
        size_t dh1 = A(act, 0);
        grad_ready(r, param_index_layer(l, W_FFN_NORM));
        F(dn2);
        F(s->rstd2);
        F(s->h1);
        F(dy);
        size_t dout = A(act, 0);
        grad_ready(r, param_index_layer(l, W_O));
        size_t dq = A(act, 0), dk = A(act, 0), dv = A(act, 0);
        F(dout);
        F(s->lse);
        F(s->o);
        F(s->v);
        F(s->k);
        F(s->q);
        size_t dn1 = A(act, 0);
        grad_ready(r, param_index_layer(l, W_V));
        grad_ready(r, param_index_layer(l, W_K));
        grad_ready(r, param_index_layer(l, W_Q));
        F(dv);
        F(dk);
        F(dq);
        F(s->n1);
        size_t dx = A(act, 0);
        grad_ready(r, param_index_layer(l, W_ATTN_NORM));
        F(dn1);
        F(s->rstd1);
        F(dh1);
        F(s->x);
        dy = dx;
    }
    grad_ready(r, param_index_embedding());
    F(dy);
    F(ids);
    buckets_drain(r);
    /* optimizer: AdamW with fp32 states sharded over `shards` ranks (ZeRO-1) */
    for (size_t i = 0; i < r->nparams; i++) {
        uint64_t shard = (r->param_bytes[i] / BF16 * FP32 + r->shards - 1) / r->shards;
        if (step_no == 0) {
            r->opt_m[i] = A(shard, 0);
            r->opt_v[i] = A(shard, 0);
        }
        size_t tmp = A(shard, 0); /* the update before it is applied */
        F(tmp);
    }
    /* zero_grad(set_to_none=True) */
    for (size_t i = 0; i < r->nparams; i++) {
        F(r->grad[i]);
        r->grad[i] = 0;
    }
    F(loss);
}

static void usage(void)
{
    fprintf(stderr, "usage: gen_trace --model 7b|13b [--seq N] [--batch N] [--steps N] [--shards Z] "
                    "[--bucket-mib N] [--inflight N] [--cross-free 1] --out FILE\n");
    exit(2);
}

static uint64_t num(const char *s)
{
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    if (*e || v == 0)
        usage();
    return v;
}

/* The program, callable from a test (tests/test_backend_cuda_vmm_replay.c
 * and tests/test_expand_vs_pytorch.c build this file with GEN_TRACE_NO_MAIN
 * and call it in a child process, tests/gentrace.h: the writer's state is
 * global and an error exits). */
int gen_trace_run(int argc, char **argv);
int gen_trace_run(int argc, char **argv)
{
    run_t r;
    memset(&r, 0, sizeof r);
    const char *model = NULL, *path = NULL;
    r.seq = 4096;
    r.batch = 1;
    r.steps = 3;
    r.shards = 8;
    r.bucket = (uint64_t)25 << 20;
    r.inflight = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--out"))
            path = v;
        else if (!strcmp(a, "--seq"))
            r.seq = num(v);
        else if (!strcmp(a, "--batch"))
            r.batch = num(v);
        else if (!strcmp(a, "--steps"))
            r.steps = num(v);
        else if (!strcmp(a, "--shards"))
            r.shards = num(v);
        else if (!strcmp(a, "--bucket-mib"))
            r.bucket = num(v) << 20;
        else if (!strcmp(a, "--inflight"))
            r.inflight = num(v);
        else if (!strcmp(a, "--cross-free"))
            cross_free = num(v) == 1 ? true : (usage(), false);
        else
            usage();
    }
    if (argc % 2 == 0 || !model || !path || r.inflight > 32)
        usage();
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (!strcmp(models[i].name, model))
            r.m = models[i];
    if (!r.m.name)
        usage();
    r.tokens = r.batch * r.seq;
    const uint64_t h = r.m.h, f = r.m.ffn, V = r.m.vocab;
    r.nparams = 1 + (size_t)r.m.layers * W_PER_LAYER + 2;
    r.param_bytes = calloc(r.nparams, sizeof *r.param_bytes);
    r.grad = calloc(r.nparams, sizeof *r.grad);
    r.opt_m = calloc(r.nparams, sizeof *r.opt_m);
    r.opt_v = calloc(r.nparams, sizeof *r.opt_v);
    saved_t *sv = calloc(r.m.layers, sizeof *sv);
    if (!r.param_bytes || !r.grad || !r.opt_m || !r.opt_v || !sv)
        die("out of memory");
    r.param_bytes[param_index_embedding()] = V * h * BF16;
    for (uint64_t l = 0; l < r.m.layers; l++) {
        static const int sq[] = {W_Q, W_K, W_V, W_O};
        r.param_bytes[param_index_layer(l, W_ATTN_NORM)] = h * BF16;
        r.param_bytes[param_index_layer(l, W_FFN_NORM)] = h * BF16;
        for (int k = 0; k < 4; k++)
            r.param_bytes[param_index_layer(l, sq[k])] = h * h * BF16;
        r.param_bytes[param_index_layer(l, W_1)] = f * h * BF16;
        r.param_bytes[param_index_layer(l, W_3)] = f * h * BF16;
        r.param_bytes[param_index_layer(l, W_2)] = h * f * BF16;
    }
    r.param_bytes[param_index_final_norm(&r)] = h * BF16;
    r.param_bytes[param_index_lm_head(&r)] = V * h * BF16;

    out = fopen(path, "w");
    if (!out)
        die("cannot open the output file");
    fprintf(out, "op,id,size,stream\n");
    uint64_t params = 0;
    for (size_t i = 0; i < r.nparams; i++) {
        A(r.param_bytes[i], 0); /* weights: persistent, never freed */
        params += r.param_bytes[i] / BF16;
    }
    for (uint64_t s = 0; s < r.steps; s++)
        step(&r, sv, (int)s);
    if (fclose(out))
        die("write error");
    fprintf(stderr, "gen_trace: %s: %.2fB parameters, %llu steps, %llu events, peak live %.2f GiB, live at end %.2f GiB\n",
            r.m.name, (double)params / 1e9, (unsigned long long)r.steps, (unsigned long long)nevents,
            (double)peak_live / (1 << 30), (double)live_bytes / (1 << 30));
    free(r.param_bytes);
    free(r.grad);
    free(r.opt_m);
    free(r.opt_v);
    free(sv);
    free(sizes);
    free(streams);
    free(live);
    return 0;
}

#ifndef GEN_TRACE_NO_MAIN
int main(int argc, char **argv)
{
    return gen_trace_run(argc, argv);
}
#endif
