/* The public C API: initialisation (options, backend choice, devices),
 * argument checks, and the lock around each call into the cache. Bad input
 * is rejected here with one line naming the problem; the cache below only
 * ever sees valid devices, sizes and blocks. */
#include "api/api.h"
#include "ledger/suppress.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

static pthread_once_t options_once = PTHREAD_ONCE_INIT;
static int options_rc;
static char options_error[512];
/* 0 before initialisation, 1 after, 2 in a forked child refused its
 * parent's device backend (tally__after_fork_child); api.h's
 * tally__ensure_init reads it inline. */
_Atomic int tally__initialised;
#define initialised tally__initialised

const char *tally_version(void)
{
    return TALLY_VERSION;
}

/* Defaults, then TALLY_CONF; once, before anything else. */
static void load_options(void)
{
    tally__fork_register();
    tally__options_set_checker(tally__sup_check_option);
    tally__options_default(&tally__opt);
    const char *conf = getenv("TALLY_CONF");
    if (conf && *conf) {
        options_rc = tally__options_parse(&tally__opt, conf, false, NULL);
        if (options_rc)
            snprintf(options_error, sizeof options_error, "TALLY_CONF: %s", tally_last_error());
    }
}

/* The cap needs only the device's size: the backend's capacity (CUDA:
 * cuDeviceTotalMem, no context) where it has one, so a fraction set for
 * every device starts none of them. */
static int apply_fraction_locked(tally_device_t *d, double fraction)
{
    size_t free_b = 0, total = 0;
    const tally_backend_t *be = tally__g.backend;
    if (be->capacity ? be->capacity(d->id, &total) : be->mem_info(d->id, &free_b, &total))
        return tally__fail(TALLY_EBACKEND, "memory fraction: cannot read the capacity of device %d", d->id);
    d->fraction = fraction;
    d->allowed_max = fraction > 0 && fraction < 1.0 ? (uint64_t)(fraction * (double)total) : UINT64_MAX;
    if (fraction == 0)
        d->allowed_max = 0;
    return 0;
}

/* backend:auto takes cuda when the driver loads and reports a device, else
 * host. It says so (one line on the sink, with why) only when that is
 * news: a driver is installed but cannot be used. Host on a machine with no
 * NVIDIA driver, and cuda where it works, are what one expects, and a line
 * in every process would be noise (reports and `python -m tally info` name
 * the backend). */
static const tally_backend_t *choose_backend(char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    switch (tally__opt.backend) {
    case TALLY_BACKEND_HOST:
        return &tally__backend_host;
    case TALLY_BACKEND_CUDA:
        return &tally__backend_cuda;
    case TALLY_BACKEND_ASYNC:
        return &tally__backend_async;
    default:
        break;
    }
    char probe[256];
    if (tally__cu_load(probe, sizeof probe) > 0)
        return &tally__backend_cuda;
    if (tally__cu_loaded())
        tally__diag("backend auto: using host, simulated devices (%s)", probe);
    return &tally__backend_host;
}

void tally__exit_register(void);

/* home_device:auto is LOCAL_RANK when it is one of the ndev devices, else none. */
static int resolve_home(int home, int ndev)
{
    if (home != -2)
        return home;
    const char *lr = getenv("LOCAL_RANK");
    char *end;
    long v = lr && *lr ? strtol(lr, &end, 10) : -1;
    return lr && *lr && !*end && v >= 0 && v < ndev ? (int)v : -1;
}

/* A home_device number this process has no device for is refused. */
static int check_home(int home, int ndev)
{
    if (home < ndev)
        return 0;
    return tally__fail_quiet(TALLY_ECONF, "config: home_device: %d is not a device (%d device%s: %s%d)", home,
                             ndev, ndev == 1 ? "" : "s", ndev > 1 ? "0 to " : "", ndev - 1);
}

_Atomic int tally__alloc_extra;

void tally__alloc_extra_update(void)
{
    bool site = tally__opt.ledger && (TALLY_OPT(backtrace_depth) > 0 || TALLY_OPT(python_stack) > 0);
    atomic_store_explicit(&tally__alloc_extra, site || tally__private_any(), memory_order_relaxed);
}

/* Whether options o let small requests take the cache's fast path
 * (tally__g.small_fast, lib/cache/small.c). */
static void set_small_fast(const tally_options_t *o)
{
    bool ok = !tally__g.backend->passthrough && o->roundup_divisions[0] <= 1 && o->expandable_move_budget <= 0;
    atomic_store_explicit(&tally__g.small_fast, ok, memory_order_relaxed);
}

static void do_init_locked(void);

/* Under config_lock: a tally_configure racing the first use either lands
 * before initialisation reads the options or sees it done (and is then
 * held to the runtime keys), never in between. */
static void do_init(void)
{
    tally__mutex_lock(tally__config_lock());
    do_init_locked();
    tally__mutex_unlock(tally__config_lock());
}

static void do_init_locked(void)
{
    pthread_once(&options_once, load_options);
    if (options_rc) {
        tally__g.init_rc = options_rc;
        snprintf(tally__g.init_error, sizeof tally__g.init_error, "%s", options_error);
        return;
    }
    char why[256] = "";
    tally__env_hints(); /* once, as the process starts using tally */
    const tally_backend_t *be = choose_backend(why, sizeof why);
    if (!be || be->init(&tally__opt, why, sizeof why)) {
        tally__g.init_rc = -TALLY_EBACKEND;
        if (be)
            snprintf(tally__g.init_error, sizeof tally__g.init_error, "backend %s unusable: %s", be->name,
                     why[0] ? why : "init failed");
        else
            snprintf(tally__g.init_error, sizeof tally__g.init_error, "%s", why);
        tally__diag("%s", tally__g.init_error);
        return;
    }
    if (tally__opt.expandable_segments && !be->map) {
        tally__g.init_rc = -TALLY_ECONF;
        snprintf(tally__g.init_error, sizeof tally__g.init_error,
                 "expandable_segments: backend %s cannot map pages (host and cuda can)", be->name);
        tally__diag("%s", tally__g.init_error);
        return;
    }
    if (tally__private_init_locked(be, why, sizeof why)) {
        tally__g.init_rc = -TALLY_ECONF;
        snprintf(tally__g.init_error, sizeof tally__g.init_error, "%s", why);
        tally__diag("%s", tally__g.init_error);
        return;
    }
    tally__g.backend = be;
    /* The layers above the cache, told of every block and device event. */
    tally__cache_set_hooks(&(tally_cache_hooks_t){tally__ledger_block_alloc_locked, tally__ledger_block_free_locked,
                                                  tally__ledger_device_event_locked, tally__report_oom_locked});
    int n = be->device_count();
    if (n > TALLY_MAX_DEVICES)
        n = TALLY_MAX_DEVICES;
    if (check_home(tally__opt.home_setting, n)) {
        tally__g.init_rc = -TALLY_ECONF;
        snprintf(tally__g.init_error, sizeof tally__g.init_error, "%s", tally_last_error());
        tally__diag("%s", tally__g.init_error);
        return;
    }
    for (int i = 0; i < n; i++) {
        tally_device_t *d = tally__meta_calloc(sizeof *d);
        if (!d || tally__ptrmap_init(&d->map, 1024) || tally__ledger_device_init(d)) {
            tally__g.init_rc = -TALLY_ENOMEM;
            snprintf(tally__g.init_error, sizeof tally__g.init_error, "out of host memory at initialisation");
            return;
        }
        tally__devlock_init(&d->lock);
        d->id = i;
        d->small.kind = TALLY_POOL_SMALL;
        d->large.kind = TALLY_POOL_LARGE;
        d->allowed_max = UINT64_MAX;
        d->stats.max_split_size = tally__opt.max_split_size == UINT64_MAX ? -1 : (int64_t)tally__opt.max_split_size;
        tally__g.dev[i] = d;
    }
    tally__g.ndev = n;
    if (tally__opt.memory_fraction > 0)
        for (int i = 0; i < n; i++)
            apply_fraction_locked(tally__g.dev[i], tally__opt.memory_fraction);
    tally__opt.home_device = resolve_home(tally__opt.home_setting, n);
    tally__exit_register();
    set_small_fast(&tally__opt);
    tally__alloc_extra_update();
    tally__ledger_options_update();
    atomic_store(&initialised, 1);
}

static _Atomic int refusal_said;

int tally__ensure_init_slow(void)
{
    pthread_once(&tally__g.once, do_init);
    if (TALLY_UNLIKELY(tally__g.init_rc)) {
        if (atomic_load(&initialised) == 2 && !atomic_exchange(&refusal_said, 1))
            tally__diag("%s", tally__g.init_error);
        return tally__fail_quiet(-tally__g.init_rc, "%s", tally__g.init_error);
    }
    return 0;
}

/* process.c, in the child: memory and streams of a device backend belong to the
 * parent's CUDA context, which the child cannot use; every call that needs
 * the backend fails from now on, saying so once. */
void tally__after_fork_child(void)
{
    if (atomic_load(&initialised) != 1 || tally__g.backend == &tally__backend_host)
        return;
    snprintf(tally__g.init_error, sizeof tally__g.init_error,
             "backend %s: CUDA cannot be used in a forked child (fork after CUDA started); start workers with "
             "multiprocessing's 'spawn'",
             tally__g.backend->name);
    tally__g.init_rc = -TALLY_EBACKEND;
    atomic_store(&refusal_said, 0);
    atomic_store(&initialised, 2);
}

int tally_backend_started(void)
{
    return atomic_load(&initialised) != 0;
}

int tally_init(void)
{
    return tally__ensure_init();
}

bool tally__is_initialised(void)
{
    return atomic_load(&initialised) != 0;
}

/* After initialisation only runtime keys change (the parser refuses the
 * rest); store each so that unlocked readers (TALLY_OPT) never see a torn
 * value. Strings change under config_lock, which their readers take. */
static void publish_runtime(const tally_options_t *n)
{
#define STORE(f) __atomic_store_n(&tally__opt.f, n->f, __ATOMIC_RELAXED)
    STORE(backtrace_depth);
    STORE(python_stack);
    STORE(unwinder);
    STORE(release_at_stage_end);
    STORE(stage_report);
    STORE(leak_report);
    STORE(leak_exitcode);
    STORE(home_device);
    STORE(home_setting);
    STORE(timeline);
    STORE(expandable_grow_chunk_mb);
    STORE(expandable_small_shared);
    STORE(expandable_small_pages);
    STORE(trace);
    STORE(expandable_handle_mb);
    STORE(expandable_handle_grid_mb);
    STORE(expandable_move_budget);
    STORE(sleep_alloc);
    STORE(sleep_pinned_cache);
    STORE(lock_bias);
#undef STORE
    /* Through copies: clang's generic __atomic_store takes a non-const source. */
    double gc_threshold = n->gc_threshold, memory_fraction = n->memory_fraction;
    __atomic_store(&tally__opt.gc_threshold, &gc_threshold, __ATOMIC_RELAXED);
    __atomic_store(&tally__opt.memory_fraction, &memory_fraction, __ATOMIC_RELAXED);
    memcpy(tally__opt.persistent_tags, n->persistent_tags, sizeof tally__opt.persistent_tags);
    memcpy(tally__opt.report_path, n->report_path, sizeof tally__opt.report_path);
    memcpy(tally__opt.leak_suppressions, n->leak_suppressions, sizeof tally__opt.leak_suppressions);
    set_small_fast(n);
    tally__alloc_extra_update();
    tally__ledger_options_update();
}

int tally_configure(const char *conf)
{
    if (!conf)
        return tally__fail(TALLY_EINVAL, "tally_configure: conf is NULL");
    pthread_once(&options_once, load_options);
    tally__mutex_lock(tally__config_lock());
    uint64_t seen = 0;
    int rc;
    if (!tally__is_initialised()) {
        rc = tally__options_parse(&tally__opt, conf, false, &seen);
        tally__mutex_unlock(tally__config_lock());
        return rc;
    }
    tally_options_t next;
    memcpy(&next, &tally__opt, sizeof next);
    rc = tally__options_parse(&next, conf, true, &seen);
    if (rc == 0) {
        /* Given again, the fraction is applied again: a per-device
         * tally_set_memory_fraction may have changed it since. */
        if (seen & tally__option_bit("memory_fraction")) {
            for (int i = 0; i < tally__g.ndev; i++) {
                tally_device_t *d = tally__g.dev[i];
                tally__dev_lock(&d->lock);
                /* As a key, 0 is "no cap" (its default); the per-device
                 * call keeps PyTorch's meaning of 0. */
                apply_fraction_locked(d, next.memory_fraction > 0 ? next.memory_fraction : 1.0);
                tally__dev_unlock(&d->lock);
            }
        }
        next.home_device = resolve_home(next.home_setting, tally__g.ndev);
        rc = check_home(next.home_setting, tally__g.ndev);
        if (rc)
            tally__diag("%s", tally_last_error());
        else
            publish_runtime(&next);
    }
    tally__mutex_unlock(tally__config_lock());
    return rc;
}

int tally_write_options(tally_write_fn write, void *arg)
{
    if (!write)
        return tally__fail(TALLY_EINVAL, "tally_write_options: write is NULL");
    pthread_once(&options_once, load_options);
    tally__mutex_lock(tally__config_lock());
    tally_options_t copy = tally__opt;
    tally__mutex_unlock(tally__config_lock());
    tally_out_t o;
    tally__out_init(&o, write, arg);
    return tally__options_write(&copy, &o);
}

const char *tally_backend_name(void)
{
    if (tally__ensure_init())
        return "none";
    return tally__g.backend->name;
}

int tally_device_count(void)
{
    int rc = tally__ensure_init();
    return rc ? rc : tally__g.ndev;
}

/* The device, or NULL with an error naming the call and the number. */
tally_device_t *tally__device(int device, const char *fn)
{
    if (tally__ensure_init())
        return NULL;
    if (TALLY_LIKELY(device >= 0 && device < tally__g.ndev))
        return tally__g.dev[device]; /* no call on the hot path; the lookup reports a bad device */
    return tally__device_lookup(device, fn);
}

/* The slow half inline here, not a call: the allocation site is captured
 * in the function PyTorch or the user called, so that the frame above it is
 * the caller's at every optimisation level (at -O1, as the sanitizer builds
 * compile, GCC makes no tail calls, and a call to an out-of-line slow half
 * would leave tally_malloc's own frame on the stack, to be taken for the
 * site). */
/* The fast half's miss: nothing done (the slow half's, below), or the
 * cache's failure, already reported. No block starts at address 1 (blocks
 * are 512-byte aligned). */
#define MALLOC_MISS ((void *)(uintptr_t)1)
static void *malloc_miss(size_t size, int device, void *stream, bool failed)
{
    (void)size, (void)device, (void)stream;
    return failed ? NULL : MALLOC_MISS;
}

/* The slow half is inline here, not in a function of its own: the site is
 * captured in this frame, so the frame above it is the caller's whether or
 * not the compiler makes tail calls (-O1, the sanitizer builds), and in a
 * program that links libtally.a, where no range of addresses tells tally's
 * frames from the program's. */
void *tally_malloc(size_t size, int device, void *stream)
{
    if (TALLY_LIKELY(tally__malloc_fast_ok(size, device))) {
        void *p = tally__cache_malloc_biased(tally__g.dev[device], size, device, stream, malloc_miss);
        if (TALLY_LIKELY(p != MALLOC_MISS))
            return p;
    }
    return tally__malloc_slow_inline(size, device, stream);
}

size_t tally_empty_cache(int device)
{
    if (tally__ensure_init())
        return 0;
    if (device != -1 && !tally__device(device, "tally_empty_cache"))
        return 0;
    size_t released = 0;
    for (int i = 0; i < tally__g.ndev; i++) {
        if (device != -1 && device != i)
            continue;
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        released += tally__cache_release_all_locked(d);
        tally__dev_unlock(&d->lock);
    }
    return released;
}

int tally_set_memory_fraction(double fraction, int device)
{
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return tally__fail(TALLY_EINVAL, "tally_set_memory_fraction: fraction %g is not in [0, 1]", fraction);
    tally_device_t *d = tally__device(device, "tally_set_memory_fraction");
    if (!d)
        return -TALLY_EINVAL;
    tally__dev_lock(&d->lock);
    int rc = apply_fraction_locked(d, fraction);
    tally__dev_unlock(&d->lock);
    return rc;
}

int tally_pool_peer_access(int device, int peer)
{
    tally_device_t *d = tally__device(device, "tally_pool_peer_access");
    if (!d)
        return -TALLY_EINVAL;
    if (!tally__device(peer, "tally_pool_peer_access"))
        return -TALLY_EINVAL;
    if (peer == device)
        return tally__fail(TALLY_EINVAL, "tally_pool_peer_access: peer %d is the device itself", peer);
    const tally_backend_t *be = tally__g.backend;
    if (!be->pool_peer_access)
        return 0; /* memory follows the program's own peer access */
    char why[256] = "";
    tally__dev_lock(&d->lock);
    int rc = be->pool_peer_access(device, peer, why, sizeof why);
    tally__dev_unlock(&d->lock);
    return rc ? tally__fail(TALLY_EBACKEND, "tally_pool_peer_access: device %d, peer %d: %s", device, peer, why) : 0;
}

int tally_get_memory_fraction(int device, double *fraction)
{
    if (!fraction)
        return tally__fail(TALLY_EINVAL, "tally_get_memory_fraction: fraction is NULL");
    tally_device_t *d = tally__device(device, "tally_get_memory_fraction");
    if (!d)
        return -TALLY_EINVAL;
    tally__dev_lock(&d->lock);
    *fraction = d->allowed_max == UINT64_MAX ? 1.0 : d->fraction;
    tally__dev_unlock(&d->lock);
    return 0;
}

int tally_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return tally__fail(TALLY_EINVAL, "tally_mem_get_info: NULL argument");
    tally_device_t *d = tally__device(device, "tally_mem_get_info");
    if (!d)
        return -TALLY_EINVAL;
    tally__dev_lock(&d->lock);
    int rc = tally__g.backend->mem_info(device, free_bytes, total_bytes);
    tally__dev_unlock(&d->lock);
    return rc ? tally__fail(TALLY_EBACKEND, "tally_mem_get_info: backend failed on device %d", device) : 0;
}

int tally_check(void)
{
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    char why[400];
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_device_t *d = tally__g.dev[i];
        tally__dev_lock(&d->lock);
        rc = tally__cache_check_locked(d, why, sizeof why);
        tally__dev_unlock(&d->lock);
        if (rc)
            return tally__fail(TALLY_ESTATE, "tally_check: device %d: %s", i, why);
    }
    return 0;
}

int tally_get_stats(int device, tally_stats_t *out)
{
    if (!out)
        return tally__fail(TALLY_EINVAL, "tally_get_stats: out is NULL");
    tally_device_t *d = tally__device(device, "tally_get_stats");
    if (!d)
        return -TALLY_EINVAL;
    tally__dev_lock(&d->lock);
    tally__cache_fill_derived_locked(d, out);
    tally__dev_unlock(&d->lock);
    return 0;
}

int tally_reset_peak_stats(int device)
{
    tally_device_t *d = tally__device(device, "tally_reset_peak_stats");
    if (!d)
        return -TALLY_EINVAL;
    tally__dev_lock(&d->lock);
    tally__cache_stats_sync_locked(d); /* the values the peaks take */
    tally__stats_reset_peak(&d->stats);
    if (tally__g.backend->pool_reset_peak)
        tally__g.backend->pool_reset_peak(d->id);
    tally__dev_unlock(&d->lock);
    return 0;
}

int tally_reset_accumulated_stats(int device)
{
    tally_device_t *d = tally__device(device, "tally_reset_accumulated_stats");
    if (!d)
        return -TALLY_EINVAL;
    tally__dev_lock(&d->lock);
    tally__cache_stats_sync_locked(d); /* the totals the base takes */
    tally__stats_reset_accumulated(&d->stats, &d->stats_base);
    tally__dev_unlock(&d->lock);
    return 0;
}

int tally_write_stats_json(int device, tally_write_fn write, void *arg)
{
    tally_stats_t s;
    if (!write)
        return tally__fail(TALLY_EINVAL, "tally_write_stats_json: write is NULL");
    int rc = tally_get_stats(device, &s);
    if (rc)
        return rc;
    tally_out_t o;
    tally__out_init(&o, write, arg);
    tally__stats_json(&s, &o);
    tally__out_flush(&o);
    return o.failed ? -TALLY_ENOMEM : 0;
}

static int need_host(const char *fn)
{
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    if (tally__g.backend != &tally__backend_host)
        return tally__fail(TALLY_ESTATE, "%s: only the host backend has this control (backend is %s)", fn,
                           tally__g.backend->name);
    return 0;
}

int tally_host_stream_hold(void *stream, int hold)
{
    int rc = need_host("tally_host_stream_hold");
    return rc ? rc : tally__host_stream_hold(stream, hold);
}

int tally_host_fail_alloc(uint64_t nth, uint64_t every)
{
    int rc = need_host("tally_host_fail_alloc");
    return rc ? rc : tally__host_fail_alloc(nth, every);
}

int tally_host_calls(int device, tally_host_calls_t *out)
{
    int rc = need_host("tally_host_calls");
    if (rc)
        return rc;
    if (!out)
        return tally__fail(TALLY_EINVAL, "tally_host_calls: out is NULL");
    if (!tally__device(device, "tally_host_calls"))
        return -TALLY_EINVAL;
    return tally__host_calls(device, out);
}
