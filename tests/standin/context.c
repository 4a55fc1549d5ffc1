/* The CUDA stand-in: primary contexts and the per-thread context stack.
 *
 * A device's primary context exists only while retained: the first
 * cuDevicePrimaryCtxRetain activates it (charging its device memory, see
 * init.c), the last cuDevicePrimaryCtxRelease resets it (its allocations and
 * streams go; the handle stays the same, and a reset context left current
 * gives CUDA_ERROR_CONTEXT_IS_DESTROYED). cuDevicePrimaryCtxGetState tells
 * whether it is active: that is how a test asserts "no context on device 2",
 * on the stand-in and on a GPU alike.
 *
 * Each thread has a stack of current contexts (64 deep in the stand-in). */
#include "standin.h"

#define SI_STACK_DEPTH 64

static _Thread_local struct CUctx_st *si_stack[SI_STACK_DEPTH];
static _Thread_local int si_depth;

struct CUctx_st *si_current(void)
{
    return si_depth > 0 ? si_stack[si_depth - 1] : NULL;
}

/* CUDA_ERROR_CONTEXT_IS_DESTROYED (cuda.h): 'the context current to the
 * calling thread has been destroyed using cuCtxDestroy, or is a primary
 * context which has not yet been initialized'. */
CUresult si_need_current(struct CUctx_st **ctx)
{
    struct CUctx_st *c = si_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c->active)
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = c;
    return CUDA_SUCCESS;
}

/* A context handle the stand-in made: one of the primary contexts. */
static bool si_is_context(CUcontext ctx)
{
    for (int d = 0; d < si_config.devices; d++)
        if (ctx == &si_devices[d].ctx)
            return true;
    return false;
}

/* cuDevicePrimaryCtxRetain: 'Once the user successfully retains the primary
 * context, the primary context will be active and available to the user
 * until the user releases it ... Unlike cuCtxCreate() the newly retained
 * context is not pushed onto the stack.' CUDA_ERROR_OUT_OF_MEMORY is among
 * its results: activating charges the device. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    SI_ENTER();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *c = &si_devices[dev].ctx;
    if (!c->active) {
        if (!si_charge(dev, c->charge)) {
            pthread_mutex_unlock(&si_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        c->active = true;
    }
    c->refs++;
    *ctx = c;
    pthread_mutex_unlock(&si_lock);
    return CUDA_SUCCESS;
}

/* cuDevicePrimaryCtxRelease: 'The context is automatically reset once the
 * last reference to it is released ... Releasing a primary context that has
 * not been previously retained will fail with CUDA_ERROR_INVALID_CONTEXT ...
 * unlike cuCtxDestroy() this method does not pop the context from stack in
 * any circumstances.' */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    SI_ENTER();
    if (!si_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *c = &si_devices[dev].ctx;
    if (c->refs == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refs == 0) {
        c->active = false;
        c->gen++;
        c->legacy = NULL;
        for (int p = 0; p < SI_MAX_DEVICES; p++)
            c->peer[p] = false;
        si_memory_reset(c);
        si_uncharge(dev, c->charge);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuDevicePrimaryCtxGetState: 'Returns in *active whether the primary context
 * is active' (and its flags: the stand-in's are always 0). */
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    SI_ENTER();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!si_valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&si_lock);
    *flags = 0;
    *active = si_devices[dev].ctx.active;
    pthread_mutex_unlock(&si_lock);
    return CUDA_SUCCESS;
}

/* cuCtxPushCurrent: 'Pushes the given context ctx onto the CPU thread's
 * stack of current contexts. The specified context becomes the CPU thread's
 * current context'; an invalid handle is CUDA_ERROR_INVALID_CONTEXT. */
CUresult cuCtxPushCurrent(CUcontext ctx)
{
    SI_ENTER();
    if (!si_is_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (si_depth == SI_STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE; /* the stand-in's limit */
    si_stack[si_depth++] = ctx;
    return CUDA_SUCCESS;
}

/* cuCtxPopCurrent: 'Pops the current CUDA context from the CPU thread and
 * passes back the old context handle in *pctx'; with no current context,
 * CUDA_ERROR_INVALID_CONTEXT. */
CUresult cuCtxPopCurrent(CUcontext *ctx)
{
    SI_ENTER();
    if (si_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = si_stack[--si_depth];
    if (ctx)
        *ctx = c;
    return CUDA_SUCCESS;
}

/* cuCtxGetCurrent: 'Returns in *pctx the CUDA context bound to the calling
 * CPU thread. If no context is bound to the calling CPU thread then *pctx is
 * set to NULL and CUDA_SUCCESS is returned.' */
CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    SI_ENTER();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = si_current();
    return CUDA_SUCCESS;
}

/* cuCtxSetCurrent: 'Binds the specified CUDA context to the calling CPU
 * thread. If ctx is NULL then the CUDA context previously bound to the
 * calling CPU thread is unbound ... If there exists a CUDA context stack on
 * the calling CPU thread, this will replace the top of that stack with ctx.' */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    SI_ENTER();
    if (ctx && !si_is_context(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx) {
        if (si_depth > 0)
            si_depth--;
    } else if (si_depth > 0) {
        si_stack[si_depth - 1] = ctx;
    } else {
        si_stack[si_depth++] = ctx;
    }
    return CUDA_SUCCESS;
}

/* cuCtxGetDevice: 'Returns in *device the ordinal of the current context's
 * device'; CUDA_ERROR_INVALID_CONTEXT without one. */
CUresult cuCtxGetDevice(CUdevice *device)
{
    SI_ENTER();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *c = NULL;
    rc = si_need_current(&c);
    if (!rc)
        *device = c->dev;
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuCtxSynchronize: 'Blocks until the current context has completed all
 * preceding requested tasks' (CUDA_ERROR_INVALID_CONTEXT without one). It is
 * a synchronisation point of the context's pools (cuMemPoolSetAttribute,
 * CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: released 'on the next call to stream,
 * event or context synchronize'). During a capture on one of its streams it
 * is illegal in every mode; during any other capture it is a potentially
 * unsafe call (capture.c). */
CUresult cuCtxSynchronize(void)
{
    SI_ENTER();
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *c = NULL;
    rc = si_need_current(&c);
    if (!rc)
        rc = si_capture_ctx_check(c);
    if (!rc)
        rc = si_capture_unsafe_call();
    if (!rc) {
        for (struct CUstream_st *s = si_all_streams; s; s = s->next_all)
            if (s->ctx == c && s->gen == c->gen)
                si_stream_wait(s, s->enqueued);
        si_pool_sync_point(c->dev);
    }
    pthread_mutex_unlock(&si_lock);
    return rc;
}

/* cuCtxEnablePeerAccess: 'Returns CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED if
 * direct access of peerContext from the current context has already been
 * enabled ... CUDA_ERROR_INVALID_CONTEXT if there is no current context,
 * peerContext is not a valid context, or if the current context is
 * peerContext ... CUDA_ERROR_INVALID_VALUE if Flags is not 0.' Memory pools
 * ignore it (pool access is cuMemPoolSetAccess's, pool.c). */
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    SI_ENTER();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&si_lock);
    struct CUctx_st *c = NULL;
    rc = si_need_current(&c);
    if (!rc && (!si_is_context(peer) || !peer->active || peer == c))
        rc = CUDA_ERROR_INVALID_CONTEXT;
    if (!rc && c->peer[peer->dev])
        rc = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (!rc)
        c->peer[peer->dev] = true;
    pthread_mutex_unlock(&si_lock);
    return rc;
}
