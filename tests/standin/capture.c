/* The CUDA stand-in: stream capture.
 *
 * cuStreamBeginCapture: 'When a stream is in capture mode, all operations
 * pushed into the stream will not be executed, but will instead be captured
 * into a graph, which will be returned via cuStreamEndCapture.' The stand-in
 * counts captured operations (the graph's nodes) and runs none of them.
 *
 * Rules, each checked where the call is made:
 * - Potentially unsafe calls (cuThreadExchangeStreamCaptureMode, the modes:
 *   GLOBAL: 'If the local thread has an ongoing capture sequence that was
 *   not initiated with CU_STREAM_CAPTURE_MODE_RELAXED at cuStreamBeginCapture,
 *   or if any other thread has a concurrent capture sequence initiated with
 *   CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from
 *   potentially unsafe API calls'; THREAD_LOCAL: only the thread's own
 *   capture counts; RELAXED: 'not prohibited'). The calls the stand-in treats
 *   as potentially unsafe: cuMemAlloc ('such as a call to cudaMalloc') and
 *   cuMemFree (it 'may perform implicit synchronization', cuMemFree). Such a
 *   call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ('the operation is
 *   not permitted when the stream is capturing').
 * - Synchronising or querying a capturing stream, a context with a
 *   capturing stream (cuCtxSynchronize) or an event last recorded in a
 *   capture: CUDA Programming Guide, CUDA Graphs, "Prohibited and Unhandled
 *   Operations": 'It is invalid to synchronize or query the execution status
 *   of a stream which is being captured or a captured event', and by
 *   extension a device or context with a stream in capture. Errors:
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED for streams and contexts,
 *   CUDA_ERROR_CAPTURED_EVENT ('the operation is not permitted on an event
 *   which was last recorded in a capturing stream') for events; RELAXED mode
 *   does not lift it ('the thread is still prohibited from API calls which
 *   necessarily conflict with stream capture, for example, attempting
 *   cuEventQuery on an event that was last recorded inside a capture
 *   sequence').
 * - The legacy stream while a blocking stream of its context captures
 *   (cuStreamIsCapturing: 'the legacy stream is in an unusable state until
 *   the blocking stream capture is terminated'): work on it or a query of it
 *   fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; cuStreamIsCapturing on it
 *   returns that error without invalidating.
 * - Invalidation (Programming Guide, "Invalidation": 'When any illegal
 *   operation is attempted during stream capture, any associated capture
 *   graphs are invalidated'): each refusal above invalidates the captures
 *   involved; work then pushed to the stream fails with
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and cuStreamEndCapture returns
 *   that error with a NULL graph ('If capture was invalidated, due to a
 *   violation of the rules of stream capture, then a NULL graph will be
 *   returned').
 *
 * Simplifications: no cross-stream capture (a stream waiting on an event
 * recorded in a capture is refused with CUDA_ERROR_NOT_SUPPORTED), so every
 * capture has exactly one stream; no graph instantiation or launch. */
#include "standin.h"

#include <stdlib.h>

static _Thread_local CUstreamCaptureMode si_thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static struct si_capture *si_captures;
static struct CUgraph_st *si_graphs;

CUresult si_capture_unsafe_call(void)
{
    if (si_thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    bool prohibited = false;
    pthread_t self = pthread_self();
    for (struct CUstream_st *s = si_all_streams; s; s = s->next_all) {
        struct si_capture *c = s->capture;
        if (!c)
            continue;
        bool local = pthread_equal(c->thread, self);
        if ((local && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!local && si_thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            c->invalidated = true;
            prohibited = true;
        }
    }
    return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* A blocking stream (not CU_STREAM_NON_BLOCKING, not the legacy stream
 * itself) of ctx is capturing; invalidate those captures when asked. */
static bool si_blocking_capture(struct CUctx_st *ctx, bool invalidate)
{
    bool any = false;
    for (struct CUstream_st *s = si_all_streams; s; s = s->next_all) {
        if (s->ctx != ctx || s->gen != ctx->gen || !s->capture || s->legacy || (s->flags & CU_STREAM_NON_BLOCKING))
            continue;
        any = true;
        if (invalidate)
            s->capture->invalidated = true;
    }
    return any;
}

int si_capture_enqueue(struct CUstream_st *s)
{
    if (s->capture) {
        if (s->capture->invalidated)
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        s->capture->nodes++;
        return SI_CAPTURED;
    }
    if (s->legacy && si_blocking_capture(s->ctx, true))
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return CUDA_SUCCESS;
}

CUresult si_capture_sync_check(struct CUstream_st *s)
{
    if (s->capture) {
        s->capture->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (s->legacy && si_blocking_capture(s->ctx, true))
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return CUDA_SUCCESS;
}

CUresult si_capture_event_check(struct CUevent_st *e)
{
    if (!e->captured)
        return CUDA_SUCCESS;
    if (!e->captured->ended)
        e->captured->invalidated = true;
    return CUDA_ERROR_CAPTURED_EVENT;
}

CUresult si_capture_ctx_check(struct CUctx_st *ctx)
{
    bool any = false;
    for (struct CUstream_st *s = si_all_streams; s; s = s->next_all) {
        if (s->ctx == ctx && s->gen == ctx->gen && s->capture) {
            s->capture->invalidated = true;
            any = true;
        }
    }
    return any ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

static bool si_mode_valid(CUstreamCaptureMode mode)
{
    return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
           mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

/* cuStreamBeginCapture: 'Capture may not be initiated if stream is
 * CU_STREAM_LEGACY ... it may only be initiated if the stream is not already
 * in capture mode.' The NULL stream is the legacy stream here. A stream
 * already capturing gives CUDA_ERROR_ILLEGAL_STATE ('a resource required by
 * the API call is not in a valid state'); the legacy stream
 * CUDA_ERROR_INVALID_VALUE (in its documented results). */
CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode)
{
    SI_ENTER();
    if (!si_mode_valid(mode))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc && s->legacy)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc && s->capture)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    if (!rc) {
        struct si_capture *c = calloc(1, sizeof *c);
        if (!c) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *c = (struct si_capture){.mode = mode, .thread = pthread_self(), .origin = s, .next_all = si_captures};
            si_captures = c;
            s->capture = c;
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamIsCapturing: NONE, ACTIVE or INVALIDATED ('The stream was
 * capturing but an error has invalidated the capture sequence'); on the
 * legacy stream while a blocking stream of its context captures,
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ('The blocking stream capture is not
 * invalidated'). */
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status)
{
    SI_ENTER();
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    if (!rc && s->legacy && si_blocking_capture(s->ctx, false))
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (!rc)
        *status = !s->capture ? CU_STREAM_CAPTURE_STATUS_NONE
                  : s->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                            : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuStreamEndCapture: 'Capture must have been initiated on hStream via a
 * call to cuStreamBeginCapture' (else CUDA_ERROR_ILLEGAL_STATE); 'If the mode
 * argument to cuStreamBeginCapture was not CU_STREAM_CAPTURE_MODE_RELAXED,
 * this call must be from the same thread' (else
 * CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD); an invalidated capture ends with
 * a NULL graph and CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    SI_ENTER();
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUstream_st *s = NULL;
    rc = si_stream_get(stream, &s);
    struct si_capture *c = rc ? NULL : s->capture;
    if (!rc && !c)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    if (!rc && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (!rc) {
        c->ended = true;
        s->capture = NULL;
        *graph = NULL;
        if (c->invalidated) {
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            struct CUgraph_st *g = calloc(1, sizeof *g);
            if (!g)
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            else
                *g = (struct CUgraph_st){.nodes = c->nodes, .next_all = si_graphs};
            if (g)
                si_graphs = g;
            *graph = g;
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuGraphDestroy: 'Destroys the graph specified by hGraph'. The stand-in
 * keeps the struct and refuses a second destroy (CUDA_ERROR_INVALID_VALUE). */
CUresult cuGraphDestroy(CUgraph graph)
{
    SI_ENTER();
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    if (graph->destroyed)
        rc = CUDA_ERROR_INVALID_VALUE;
    graph->destroyed = true;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuThreadExchangeStreamCaptureMode: 'Sets the calling thread's stream
 * capture interaction mode to the value contained in *mode, and overwrites
 * *mode with the previous mode for the thread.' The default is GLOBAL. */
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    SI_ENTER();
    if (!mode || !si_mode_valid(*mode))
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = si_thread_mode;
    si_thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
