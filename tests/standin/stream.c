/* The CUDA stand-in: streams and host functions.
 *
 * A stream belongs to the context current when it was created. It is a FIFO
 * of operations run in order by a worker thread of its own, started at the
 * first operation: host functions (cuLaunchHostFunc), event records (a mark:
 * an event is complete once its stream has completed the mark), waits on an
 * event (cuStreamWaitEvent) and stream-ordered frees (cuMemFreeAsync). A
 * host function that blocks holds everything queued behind it: that is how
 * tests keep work pending (tests/cudautil.h, cu_hold).
 *
 * Special handles (note_null_stream in cuda.h, and cuStreamGetCtx: 'any of
 * the special streams such as the NULL stream, CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD ... Specifying any of the special handles will return
 * the context current to the calling thread. If no context is current to the
 * calling thread, CUDA_ERROR_INVALID_CONTEXT is returned'): NULL and
 * CU_STREAM_LEGACY are the current context's legacy default stream,
 * CU_STREAM_PER_THREAD the calling thread's per-thread default stream of the
 * current context.
 *
 * Simplifications: the legacy stream does not synchronise implicitly with
 * the context's other blocking streams; a per-thread default stream is never
 * freed when its thread exits; priorities are not modelled. */
#include "standin.h"

#include <stdio.h>
#include <stdlib.h>

struct CUstream_st *si_all_streams;
static _Thread_local struct CUstream_st *si_per_thread[SI_MAX_DEVICES];

static struct CUstream_st *si_stream_new(struct CUctx_st *ctx, unsigned flags)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ctx = ctx;
    s->gen = ctx->gen;
    s->flags = flags;
    s->next_all = si_all_streams;
    si_all_streams = s;
    return s;
}

CUresult si_stream_get(CUstream handle, struct CUstream_st **out)
{
    struct CUctx_st *ctx = NULL;
    if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
        CUresult rc = si_need_current(&ctx);
        if (rc)
            return rc;
        struct CUstream_st **slot = handle == CU_STREAM_PER_THREAD ? &si_per_thread[ctx->dev] : &ctx->legacy;
        if (!*slot || (*slot)->gen != ctx->gen) {
            *slot = si_stream_new(ctx, CU_STREAM_DEFAULT);
            if (!*slot)
                return CUDA_ERROR_OUT_OF_MEMORY;
            (*slot)->legacy = handle != CU_STREAM_PER_THREAD;
            (*slot)->per_thread = handle == CU_STREAM_PER_THREAD;
        }
        *out = *slot;
        return CUDA_SUCCESS;
    }
    for (struct CUstream_st *s = si_all_streams; s; s = s->next_all) {
        if (s != handle)
            continue;
        /* A destroyed stream, or one of a context reset since, is gone. */
        if (s->destroyed || s->gen != s->ctx->gen)
            return CUDA_ERROR_INVALID_HANDLE;
        *out = s;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_HANDLE;
}

static void *si_worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&si_lock);
    for (;;) {
        while (!s->head && !s->destroyed)
            pthread_cond_wait(&si_cond, &si_lock);
        struct si_op *op = s->head;
        if (!op)
            break; /* destroyed and drained */
        switch (op->kind) {
        case SI_OP_HOST:
            pthread_mutex_unlock(&si_lock);
            op->fn(op->arg);
            pthread_mutex_lock(&si_lock);
            break;
        case SI_OP_WAIT:
            si_stream_wait(op->wait_stream, op->wait_seq);
            break;
        case SI_OP_POOL_FREE:
            si_pool_block_freed(op->block, op->wait_seq);
            break;
        case SI_OP_MARK:
            break;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed++;
        free(op);
        pthread_cond_broadcast(&si_cond);
    }
    s->worker = false;
    pthread_mutex_unlock(&si_lock);
    return NULL;
}

unsigned long long si_stream_push(struct CUstream_st *s, struct si_op *op)
{
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    if (!s->worker) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, si_worker, s) != 0) {
            fprintf(stderr, "cuda stand-in: cannot start a stream thread\n");
            abort();
        }
        pthread_attr_destroy(&attr);
        s->worker = true;
    }
    pthread_cond_broadcast(&si_cond);
    return ++s->enqueued;
}

void si_stream_wait(struct CUstream_st *s, unsigned long long seq)
{
    while (s->completed < seq)
        pthread_cond_wait(&si_cond, &si_lock);
}

struct si_op *si_op_new(enum si_op_kind kind)
{
    struct si_op *op = calloc(1, sizeof *op);
    if (op)
        op->kind = kind;
    return op;
}

CUresult si_stream_checked(CUstream handle, struct CUstream_st **out)
{
    CUresult rc = si_stream_get(handle, out);
    return rc ? rc : si_capture_sync_check(*out);
}

bool si_stream_idle(struct CUstream_st *s)
{
    return s->completed == s->enqueued;
}

/* Queue an operation on `handle` unless it is captured: the common part of
 * the calls that enqueue work. Takes op (freed unless queued). */
static CUresult si_enqueue(CUstream handle, struct si_op *op)
{
    struct CUstream_st *s = NULL;
    CUresult rc = si_stream_get(handle, &s);
    int cap = rc ? (int)rc : si_capture_enqueue(s);
    if (cap != CUDA_SUCCESS) {
        free(op);
        return cap == SI_CAPTURED ? CUDA_SUCCESS : (CUresult)cap;
    }
    si_stream_push(s, op);
    return CUDA_SUCCESS;
}

/* cuStreamCreate: flags CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING; the
 * stream belongs to the current context (CUDA_ERROR_INVALID_CONTEXT
 * without one, in its documented results). */
CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
    SI_ENTER();
    if (!stream || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc) {
        struct CUstream_st *s = si_stream_new(ctx, flags);
        if (!s)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *stream = s;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamDestroy: 'In case the device is still doing work in the stream
 * hStream when cuStreamDestroy() is called, the function will return
 * immediately and the resources associated with hStream will be released
 * automatically once the device has completed all work'. The special
 * streams cannot be destroyed (CUDA_ERROR_INVALID_HANDLE). */
CUresult cuStreamDestroy(CUstream stream)
{
    SI_ENTER();
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc) {
        s->destroyed = true;
        pthread_cond_broadcast(&si_cond);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamGetCtx: 'The returned context is the context that was active in
 * the calling thread when the stream was created'; special handles: see
 * the header comment. */
CUresult cuStreamGetCtx(CUstream stream, CUcontext *ctx)
{
    SI_ENTER();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc)
        *ctx = s->ctx;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamGetCtx_v2 (CUDA 12.5): 'If the stream is associated with a green
 * context, the API returns the green context in pGreenCtx and the primary
 * context of the associated device in pCtx. If the stream is associated
 * with a regular context, the API returns the regular context in pCtx and
 * NULL in pGreenCtx'; special handles as cuStreamGetCtx. The stand-in has
 * no green contexts: *green is always NULL. */
CUresult cuStreamGetCtx_v2(CUstream stream, CUcontext *ctx, CUgreenCtx *green)
{
    SI_ENTER();
    if (!ctx || !green)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc) {
        *ctx = s->ctx;
        *green = NULL;
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamGetDevice (CUDA 12.8): 'Returns in *device the device of the
 * stream', special handles as cuStreamGetCtx. During a capture: refused
 * with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating, when the stream
 * captures or when the thread's capture mode prohibits potentially unsafe
 * calls (capture.c). That rule is NOT in CUDA's API reference: it is
 * measurement, from NVIDIA CCCL's notes on get_device_from_stream (driver
 * 580 rejects it during capture; ../shared/cuda.md, "CUDA graph capture").
 * It depends on the driver, so CUDA_STANDIN_STREAM_GET_DEVICE_IN_CAPTURE=1
 * lets it work in a capture (init.c). */
CUresult cuStreamGetDevice(CUstream stream, CUdevice *device)
{
    SI_ENTER();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc && !si_config.stream_device_in_capture) {
        if (s->capture) {
            si_capture_invalidate(s);
            rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        } else {
            rc = si_capture_unsafe_call();
        }
    }
    if (!rc)
        *device = s->ctx->dev;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamQuery: 'Returns CUDA_SUCCESS if all operations in the stream
 * specified by hStream have completed, or CUDA_ERROR_NOT_READY if not.' */
CUresult cuStreamQuery(CUstream stream)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_checked(stream, &s);
    if (!rc && !si_stream_idle(s))
        rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamSynchronize: 'Waits until the device has completed all operations
 * in the stream'; a synchronisation point for pools (context.c). Potentially
 * unsafe during a capture, whatever the stream (capture.c). */
CUresult cuStreamSynchronize(CUstream stream)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_checked(stream, &s);
    if (!rc)
        rc = si_capture_unsafe_call();
    if (!rc) {
        si_stream_wait(s, s->enqueued);
        si_pool_sync_point(s->ctx->dev);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamWaitEvent: 'Makes all future work submitted to hStream wait for
 * all work captured in hEvent ... hEvent may be from a different context or
 * device than hStream'; hEvent 'may not be NULL'; the wait uses the event's
 * state at the time of the call (cuEventRecord: 'APIs such as
 * cuStreamWaitEvent() use the most recently captured state at the time of
 * the API call, and are not affected by later calls to cuEventRecord()').
 * On an event last recorded in a capture, the stream joins that capture
 * (capture.c). */
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    SI_ENTER();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE; /* CU_EVENT_WAIT_EXTERNAL is capture-only: not modelled */
    pthread_mutex_lock(&si_lock);
    struct CUevent_st *e = NULL;
    rc = si_event_get(event, &e);
    struct si_op *op = NULL;
    if (!rc && e->captured) {
        /* Cross-stream capture: the stream joins the event's capture (or is
         * refused), capture.c; nothing is queued to run. */
        struct CUstream_st *s = NULL;
        rc = si_stream_get(stream, &s);
        if (!rc)
            rc = si_capture_join(s, e);
        pthread_mutex_unlock(&si_lock);
        return rc;
    } else if (!rc) {
        /* Never recorded: an empty set of work, nothing to wait for. */
        op = si_op_new(e->stream ? SI_OP_WAIT : SI_OP_MARK);
        if (!op) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            op->wait_stream = e->stream;
            op->wait_seq = e->seq;
        }
    }
    if (!rc)
        rc = si_enqueue(stream, op);
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuLaunchHostFunc: 'Enqueues a host function to run in a stream. The
 * function will be called after currently enqueued work and will block work
 * added after it.' */
CUresult cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *user_data)
{
    SI_ENTER();
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct si_op *op = si_op_new(SI_OP_HOST);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->fn = fn;
    op->arg = user_data;
    pthread_mutex_lock(&si_lock);
    rc = si_enqueue(stream, op);
    pthread_mutex_unlock(&si_lock);
    return rc;
}
