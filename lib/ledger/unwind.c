/* Native return addresses of the calling thread, for allocation sites
 * (backtrace_depth). Three unwinders, chosen with the unwinder key:
 *
 * - libunwind (unw_backtrace from libunwind.so.8, loaded with dlopen so
 *   libtally.so does not depend on it): DWARF unwinding with a per-thread
 *   cache of frame descriptions, so a site seen before is unwound from the
 *   cache. About 0.3 us at depth 16 on the reference machine
 *   (docs/benchmarks.md).
 * - glibc (backtrace): DWARF unwinding through libgcc, about 3.3 us at depth
 *   16; the fallback when libunwind is not installed.
 * - fp: walks the frame-pointer chain; tens of ns, and exact only where the
 *   program keeps frame pointers (-fno-omit-frame-pointer). Every frame is
 *   checked against this thread's stack bounds before it is read (each
 *   frame above the last, aligned, inside the stack), so code without frame
 *   pointers ends the walk early or yields wrong frames, but never a fault.
 *   tally's own frames on the way (tally_malloc, the site capture) keep
 *   frame pointers (Makefile), so the caller's frame is always right.
 *
 * auto (the default) is libunwind when it loads, else glibc (and always
 * glibc in a ThreadSanitizer build, below). */
#include "ledger/site.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* Under ThreadSanitizer libunwind is left alone: its per-thread cache is
 * freed by a thread-specific-data destructor that locks a mutex after
 * TSan has torn down the exiting thread's state, which crashes the thread. */
#if defined(__SANITIZE_THREAD__)
#define TALLY_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TALLY_UNDER_TSAN 1
#endif
#endif

typedef int (*bt_fn)(void **, int);
static bt_fn unw_backtrace_fn;
static pthread_once_t unw_once = PTHREAD_ONCE_INIT;

static void unw_load(void)
{
#ifdef TALLY_UNDER_TSAN
    return;
#endif
    void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    void *p = h ? dlsym(h, "unw_backtrace") : NULL;
    if (p)
        memcpy(&unw_backtrace_fn, &p, sizeof p);
}

bool tally__unwind_has_libunwind(void)
{
    pthread_once(&unw_once, unw_load);
    return unw_backtrace_fn != NULL;
}

/* This thread's stack, [lo, hi); hi = 0 when unknown (then no walk). */
static _Thread_local uintptr_t stack_lo, stack_hi;
static _Thread_local bool stack_known;

static void stack_bounds(void)
{
    pthread_attr_t a;
    void *base = NULL;
    size_t size = 0;
    stack_known = true;
    if (pthread_getattr_np(pthread_self(), &a) != 0)
        return;
    if (pthread_attr_getstack(&a, &base, &size) == 0 && base && size) {
        stack_lo = (uintptr_t)base;
        stack_hi = (uintptr_t)base + size;
    }
    pthread_attr_destroy(&a);
}

__attribute__((noinline)) static int fp_walk(void **frames, int max)
{
    if (!stack_known)
        stack_bounds();
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
    int n = 0;
    while (n < max) {
        /* A frame is [saved frame pointer, return address]. */
        if (fp < stack_lo || fp > stack_hi - 2 * sizeof(void *) || (fp & (sizeof(void *) - 1)))
            break;
        const uintptr_t *f = (const uintptr_t *)fp;
        uintptr_t next = f[0], ret = f[1];
        if (!ret)
            break;
        frames[n++] = (void *)ret;
        if (next <= fp) /* callers live at higher addresses */
            break;
        fp = next;
    }
    return n;
}

int tally__unwind(void **frames, int max)
{
    switch (TALLY_OPT(unwinder)) {
    case TALLY_UNWIND_FP:
        return fp_walk(frames, max);
    case TALLY_UNWIND_GLIBC:
        return backtrace(frames, max);
    default:
        if (tally__unwind_has_libunwind())
            return unw_backtrace_fn(frames, max);
        return backtrace(frames, max);
    }
}
