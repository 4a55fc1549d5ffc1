/* The CUDA stand-in: events.
 *
 * An event belongs to the context current at cuEventCreate. cuEventRecord
 * queues a mark on the stream; the event is complete once the stream has
 * completed that mark (everything queued before it). Re-recording replaces
 * what the event captures. Timing is not modelled (every event behaves as
 * created with CU_EVENT_DISABLE_TIMING). */
#include "standin.h"

#include <stdlib.h>

/* Every event ever created, so that a stale handle is recognised. */
struct si_event_node {
    struct CUevent_st event;
    struct si_event_node *next;
};
static struct si_event_node *si_events;

CUresult si_event_get(CUevent handle, struct CUevent_st **out)
{
    for (struct si_event_node *n = si_events; n; n = n->next) {
        if (&n->event != handle)
            continue;
        if (n->event.destroyed || n->event.gen != n->event.ctx->gen)
            return CUDA_ERROR_INVALID_HANDLE;
        *out = &n->event;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_HANDLE;
}

/* cuEventCreate: flags CU_EVENT_DEFAULT, CU_EVENT_BLOCKING_SYNC (0x1),
 * CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS (0x4, 'must be specified
 * with CU_EVENT_DISABLE_TIMING'); 'Creates an event *phEvent for the current
 * context' (CUDA_ERROR_INVALID_CONTEXT without one). */
CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
    SI_ENTER();
    if (!event || (flags & ~0x7u) || ((flags & 0x4u) && !(flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *ctx = NULL;
    rc = si_need_current(&ctx);
    if (!rc) {
        struct si_event_node *n = calloc(1, sizeof *n);
        if (!n) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            n->event.ctx = ctx;
            n->event.gen = ctx->gen;
            n->next = si_events;
            si_events = n;
            *event = &n->event;
        }
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuEventRecord: 'Captures in hEvent the contents of hStream at the time of
 * this call. hEvent and hStream must be from the same context otherwise
 * CUDA_ERROR_INVALID_HANDLE is returned ... cuEventRecord() can be called
 * multiple times on the same event and will overwrite the previously
 * captured state.' Recorded in a capturing stream, the event captures work
 * of the capture, not executed work (capture.c). */
CUresult cuEventRecord(CUevent event, CUstream stream)
{
    SI_ENTER();
    struct si_op *op = si_op_new(SI_OP_MARK);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&si_lock);
    struct CUevent_st *e = NULL;
    struct CUstream_st *s = NULL;
    rc = si_event_get(event, &e);
    if (!rc)
        rc = si_stream_get(stream, &s);
    if (!rc && e->ctx != s->ctx)
        rc = CUDA_ERROR_INVALID_HANDLE;
    int cap = rc ? (int)rc : si_capture_enqueue(s);
    if (cap == SI_CAPTURED) {
        si_capture_event_recorded(s, e);
        rc = CUDA_SUCCESS;
    } else if (cap == CUDA_SUCCESS) {
        e->seq = si_stream_push(s, op);
        e->stream = s;
        e->captured = NULL;
        op = NULL;
    } else {
        rc = (CUresult)cap;
    }
    pthread_mutex_unlock(&si_lock);
    free(op);
    return rc;
}

/* An event that is to be queried or synchronised: the capture rules for
 * those (capture.c) included: one recorded in a capture is refused in every
 * mode; any other is a potentially unsafe call. */
static CUresult si_event_checked(CUevent event, struct CUevent_st **e)
{
    CUresult rc = si_event_get(event, e);
    if (!rc)
        rc = si_capture_event_check(*e);
    if (!rc)
        rc = si_capture_unsafe_call();
    return rc;
}

static bool si_event_done(const struct CUevent_st *e)
{
    return !e->stream || e->stream->completed >= e->seq;
}

/* cuEventQuery: 'Returns CUDA_SUCCESS if all captured work has been
 * completed, or CUDA_ERROR_NOT_READY if any captured work is incomplete';
 * cuEventRecord: 'Before the first call to cuEventRecord(), an event
 * represents an empty set of work, so for example cuEventQuery() would
 * return CUDA_SUCCESS.' */
CUresult cuEventQuery(CUevent event)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUevent_st *e = NULL;
    rc = si_event_checked(event, &e);
    if (!rc && !si_event_done(e))
        rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuEventSynchronize: 'Waits until the completion of all work currently
 * captured in hEvent'; a synchronisation point for pools (release
 * threshold, pool.c). */
CUresult cuEventSynchronize(CUevent event)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUevent_st *e = NULL;
    rc = si_event_checked(event, &e);
    if (!rc && e->stream) {
        struct CUstream_st *s = e->stream;
        si_stream_wait(s, e->seq);
        si_pool_sync_point(s->ctx->dev);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuEventDestroy: 'In case hEvent has been recorded but has not yet been
 * completed when cuEventDestroy() is called, the function will return
 * immediately and the resources associated with hEvent will be released
 * automatically once the device has completed hEvent.' */
CUresult cuEventDestroy(CUevent event)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUevent_st *e = NULL;
    rc = si_event_get(event, &e);
    if (!rc)
        e->destroyed = true;
    pthread_mutex_unlock(&si_lock);
    return rc;
}
