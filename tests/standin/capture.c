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
 *   capture counts; RELAXED: 'not prohibited'). Such a call fails with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ('the operation is not permitted
 *   when the stream is capturing') and invalidates the captures that
 *   prohibit it. The calls the stand-in treats as potentially unsafe, and
 *   where each comes from:
 *   - cuMemAlloc: CUDA's documentation ('some actions, such as a call to
 *     cudaMalloc, may be unsafe', cuThreadExchangeStreamCaptureMode);
 *   - cuMemFree: CUDA's documentation (it 'may perform implicit
 *     synchronization', cuMemFree; implicit synchronisation is what capture
 *     forbids);
 *   - cuEventQuery and cuEventSynchronize of an event that is not part of a
 *     capture: NOT from CUDA's API reference (which names no list) but from
 *     measurement reported in PyTorch's sources and pull requests: its
 *     caching allocator skips its event queries while any capture is under
 *     way ('cudaEventQueries, illegal during CUDA graph capture'), and an
 *     event query from the NCCL watchdog thread invalidated global-mode
 *     captures until that thread switched to thread-local mode (PyTorch PRs
 *     104555, 105182, 148594; ../shared/cuda.md, "CUDA graph capture");
 *   - cuStreamSynchronize and cuCtxSynchronize, of any stream or context (the
 *     driver API has no separate device synchronise; cuCtxSynchronize is
 *     it): the same sources, a synchronising call being what the unsafe
 *     cudaMalloc/cudaFree do implicitly; PyTorch releases no cached memory
 *     (which synchronises) while a capture is under way. A measurement on
 *     NVIDIA hardware (ROCm's pull request 4508, CUDA 12.0) saw another
 *     thread's synchronise of ANOTHER device leave a global capture valid:
 *     the stand-in applies the modes' rule whatever the device, stricter
 *     than that measurement (tests check that case on the stand-in only).
 *   cuStreamGetDevice is treated as potentially unsafe too (stream.c), from
 *   measurement (NVIDIA CCCL's notes on get_device_from_stream: rejected
 *   during capture by driver 580).
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
 * - Cross-stream capture (Programming Guide, CUDA Graphs, "Cross-stream
 *   Dependencies and Events": a stream that waits on an event recorded in a
 *   capturing stream joins that capture, and its later work is captured
 *   too): cuStreamWaitEvent on such an event joins the waiting stream into
 *   the event's capture (stream.c). Every joined stream's work must be
 *   joined back into the origin stream (the origin waits, directly or
 *   through other streams, on an event recorded after it) before
 *   cuStreamEndCapture, else that fails with
 *   CUDA_ERROR_STREAM_CAPTURE_UNJOINED ('the capture sequence contains a
 *   fork that was not joined to the primary stream') and a NULL graph. The
 *   capture ends on the origin only (CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 'the
 *   capture was not initiated in this stream', on a joined stream); ending
 *   it ends every joined stream's capture. A stream capturing into another
 *   capture cannot wait on the event ('It is invalid to merge two separate
 *   capture graphs by waiting on a captured event from a stream which is
 *   being captured and is associated with a different capture graph than
 *   the event': CUDA_ERROR_STREAM_CAPTURE_ISOLATION, both invalidated).
 * - Stream-ordered allocation (pool.c): cuMemAllocAsync in a capture makes a
 *   graph allocation; cuMemFreeAsync in a capture must be given a graph
 *   allocation of that capture (cuMemFreeAsync's note on stream capture:
 *   'this function results in the creation of a free node and must therefore
 *   be passed the address of a graph allocation'), else it fails and the
 *   capture is invalidated.
 * - Invalidation (Programming Guide, "Invalidation": 'When any illegal
 *   operation is attempted during stream capture, any associated capture
 *   graphs are invalidated'): each refusal above invalidates the captures
 *   involved; work then pushed to the stream fails with
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and cuStreamEndCapture returns
 *   that error with a NULL graph ('If capture was invalidated, due to a
 *   violation of the rules of stream capture, then a NULL graph will be
 *   returned').
 *
 * Simplifications: a capture spans at most SI_CAPTURE_STREAMS streams (a
 * join past that is refused with CUDA_ERROR_NOT_SUPPORTED); waiting on an
 * event of a capture that has ended is refused with CUDA_ERROR_NOT_SUPPORTED
 * (the documentation does not say); the legacy stream never joins a capture
 * (refused with CUDA_ERROR_NOT_SUPPORTED); no graph instantiation or
 * launch. */
#include "standin.h"

#include <stdlib.h>
#include <string.h>

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

/* One more node captured on s (its capture's clock for s moves on). */
static void si_capture_node(struct CUstream_st *s)
{
    struct si_capture *c = s->capture;
    int i = s->cap_index;
    c->nodes++;
    c->clock[i][i] = ++c->ops[i];
}

int si_capture_enqueue(struct CUstream_st *s)
{
    if (s->capture) {
        if (s->capture->invalidated)
            return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        si_capture_node(s);
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

void si_capture_invalidate(struct CUstream_st *s)
{
    if (s->capture)
        s->capture->invalidated = true;
}

void si_capture_event_recorded(struct CUstream_st *s, struct CUevent_st *e)
{
    struct si_capture *c = s->capture;
    e->captured = c;
    e->stream = NULL;
    memcpy(e->clock, c->clock[s->cap_index], sizeof e->clock);
}

CUresult si_capture_join(struct CUstream_st *s, struct CUevent_st *e)
{
    struct si_capture *c = e->captured;
    if (c->ended || s->legacy)
        return CUDA_ERROR_NOT_SUPPORTED; /* see the header: not modelled */
    if (s->capture && s->capture != c) {
        s->capture->invalidated = true;
        c->invalidated = true;
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    }
    if (c->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!s->capture) {
        if (c->nstreams == SI_CAPTURE_STREAMS)
            return CUDA_ERROR_NOT_SUPPORTED;
        int i = c->nstreams++;
        c->streams[i] = s;
        c->ops[i] = 0;
        memset(c->clock[i], 0, sizeof c->clock[i]);
        s->capture = c;
        s->cap_index = i;
    }
    /* The waiting stream's next nodes depend on what the event stands for. */
    unsigned long long *mine = c->clock[s->cap_index];
    for (int j = 0; j < SI_CAPTURE_STREAMS; j++)
        if (e->clock[j] > mine[j])
            mine[j] = e->clock[j];
    si_capture_node(s);
    return CUDA_SUCCESS;
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
            c->streams[0] = s;
            c->nstreams = 1;
            si_captures = c;
            s->capture = c;
            s->cap_index = 0;
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
 * a NULL graph and CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, one with unjoined
 * work with a NULL graph and CUDA_ERROR_STREAM_CAPTURE_UNJOINED; a joined
 * stream is not where the capture began (CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
 * nothing ends). */
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
    if (!rc && c->origin != s)
        rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED; /* a joined stream */
    if (!rc && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (!rc) {
        c->ended = true;
        for (int i = 0; i < c->nstreams; i++)
            c->streams[i]->capture = NULL;
        *graph = NULL;
        /* Joined back: the origin's clock covers every stream's nodes. */
        bool joined = true;
        for (int i = 1; i < c->nstreams; i++)
            joined = joined && c->clock[0][i] >= c->ops[i];
        if (c->invalidated) {
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else if (!joined) {
            rc = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        } else {
            struct CUgraph_st *g = calloc(1, sizeof *g);
            if (!g)
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            else
                *g = (struct CUgraph_st){.nodes = c->nodes, .capture = c, .next_all = si_graphs};
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
    else
        si_pool_graph_destroyed(graph->capture); /* its freed graph allocations */
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
