/* Private tags, sleep and wake on the cuda backend (docs/sleep.md), against
 * the CUDA stand-in (or a GPU with TALLY_REAL_CUDA=1): a private tag's
 * segments are virtual-memory reservations mapped whole; sleep copies live
 * blocks to pinned host memory (cuMemHostAlloc, cuMemcpyDtoH), unmaps and
 * keeps the addresses; wake maps them back and copies back (cuMemcpyHtoD).
 * The stand-in frees a released handle's memory with its last mapping, and
 * tally releases what it unmaps (tests/standin/vmm.c), so a restore that
 * copied nothing would read zeros. Each body runs in a forked child
 * (the backend is chosen once per process). */
#include "vmmutil.h"
#include "sleeputil.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

typedef unsigned long long (*calls_fn)(const char *);
static calls_fn calls;

static void load_counts(void)
{
    *(void **)&calls = dlsym(cu_lib, "cuda_standin_calls");
}

static unsigned long long ncalls(const char *name)
{
    return calls ? calls(name) : 0;
}

static const char *W[] = {"weights"}, *KV[] = {"kv"};

/* The bodies that write and read device memory from the host run only on
 * the stand-in (its device memory is host memory); on a GPU they pass. */
static void standin_only(void)
{
    if (!cu_is_standin()) {
        fprintf(stderr, "test_api_sleep_cuda: touches device memory from the host: stand-in only\n");
        _exit(0);
    }
}

static void *tagged(const char *tag, size_t size, void *stream)
{
    NEED(tally_tag_push(tag) == 0);
    void *p = tally_malloc(size, 0, stream);
    tally_tag_pop();
    NEED(p != NULL);
    return p;
}

/* The driver started, the call counts found, and device 0's primary
 * context made current (popped by the body's end). */
static CUcontext device0_current(void)
{
    start_driver();
    load_counts();
    CUcontext ctx;
    NEED(cu.cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
    NEED(cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS);
    return ctx;
}

static const char *const env_sleep[] = {"CUDA_STANDIN_DEVICES", "1", "CUDA_STANDIN_MEMORY", "2G", "TALLY_CONF",
                                        "backend:cuda,private_tags:weights|kv,leak_report:off", NULL};

static void body_offload_restores_every_byte(int fd)
{
    (void)fd;
    start_driver();
    load_counts();
    standin_only();
    void *a = tagged("weights", 24 * MiB + 512, NULL), *b = tagged("weights", 3000, NULL);
    su_fill(a, 24 * MiB + 512, 1);
    su_fill(b, 3000, 2);
    int64_t before = stats0().reserved_bytes[0].current;
    size_t free0, total;
    NEED(tally_mem_get_info(0, &free0, &total) == 0);
    unsigned long long d2h = ncalls("cuMemcpyDtoH"), pin = ncalls("cuMemHostAlloc");
    NEED(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD) == 0);
    NEED(ncalls("cuMemcpyDtoH") == d2h + 2);
    NEED(ncalls("cuMemHostAlloc") == pin + 2);
    /* The driver got the memory back; the addresses stay reserved. */
    int64_t after = stats0().reserved_bytes[0].current;
    NEED(before - after == 26 * (int64_t)MiB + 2 * (int64_t)MiB); /* its 26 MiB segment and a small one */
    size_t free1;
    NEED(tally_mem_get_info(0, &free1, &total) == 0);
    NEED(free1 - free0 == 28 * MiB);
    NEED(su_faults(a) && su_faults(b));
    tally_sleep_info_t i;
    NEED(tally_tag_sleep_info("weights", 0, &i) == 0);
    NEED(i.asleep && i.offloaded && i.sleeping_blocks == 2 && i.offload == 24 * MiB + 512 + 3072);
    NEED(tally_check() == 0);
    unsigned long long h2d = ncalls("cuMemcpyHtoD"), unpin = ncalls("cuMemFreeHost");
    NEED(tally_wake(W, 1) == 0);
    NEED(ncalls("cuMemcpyHtoD") == h2d + 2);
    NEED(ncalls("cuMemFreeHost") == unpin); /* kept pinned for the next sleep */
    NEED(stats0().reserved_bytes[0].current == before);
    NEED(su_same(a, 24 * MiB + 512, 1));
    NEED(su_same(b, 3000, 2));
    NEED(tally_check() == 0);
    /* The buffers stay pinned for the next offload (sleep_pinned_cache): a
     * second cycle pins nothing and frees nothing. */
    NEED(tally_tag_sleep_info("weights", 0, &i) == 0 && i.kept == 24 * MiB + 512 + 3072 && i.offload == 0);
    pin = ncalls("cuMemHostAlloc");
    unpin = ncalls("cuMemFreeHost");
    su_fill(a, 24 * MiB + 512, 5);
    NEED(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD) == 0);
    NEED(tally_wake(W, 1) == 0);
    NEED(ncalls("cuMemHostAlloc") == pin && ncalls("cuMemFreeHost") == unpin);
    NEED(su_same(a, 24 * MiB + 512, 5));
    /* empty_cache frees them; with the key off a wake frees them at once. */
    tally_empty_cache(0);
    NEED(ncalls("cuMemFreeHost") == unpin + 2);
    NEED(tally_tag_sleep_info("weights", 0, &i) == 0 && i.kept == 0);
    NEED(tally_configure("sleep_pinned_cache:false") == 0);
    NEED(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD) == 0);
    NEED(tally_wake(W, 1) == 0);
    NEED(ncalls("cuMemFreeHost") == unpin + 4);
    NEED(tally_tag_sleep_info("weights", 0, &i) == 0 && i.kept == 0);
    tally_free(a);
    tally_free(b);
}

static void test_offload_restores_every_byte(void **state)
{
    (void)state;
    expect_child_ok(env_sleep, body_offload_restores_every_byte);
}

/* Discard: the stand-in lost what was unmapped, so the pages come back
 * empty: proof that the restore above copied. */
static void body_discard_comes_back_empty(int fd)
{
    (void)fd;
    start_driver();
    standin_only();
    void *k = tagged("kv", 4 * MiB, NULL);
    memset(k, 0x77, 4 * MiB);
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD) == 0);
    NEED(su_faults(k));
    NEED(tally_wake(KV, 1) == 0);
    const unsigned char *c = k;
    for (size_t j = 0; j < 4 * MiB; j += 4096)
        NEED(c[j] == 0);
    tally_free(k);
}

static void test_discard_comes_back_empty(void **state)
{
    (void)state;
    expect_child_ok(env_sleep, body_discard_comes_back_empty);
}

/* The wake that finds the device full rolls back: the pages it mapped go
 * again, the tag stays asleep with its backup, the message says how much
 * was missing; once room is made the restore is exact. */
static void body_wake_oom_rolls_back(int fd)
{
    (void)fd;
    start_driver();
    standin_only();
    void *a = tagged("weights", 600 * MiB, NULL), *b = tagged("weights", 600 * MiB, NULL);
    su_fill(a, 600 * MiB, 3);
    NEED(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD) == 0);
    void *big = tally_malloc(1000 * MiB, 0, NULL);
    NEED(big != NULL);
    NEED(tally_wake(W, 1) == -TALLY_ENOMEM);
    NEED(strstr(tally_last_error(), "missing") != NULL);
    NEED(strstr(tally_last_error(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY") != NULL);
    tally_sleep_info_t i;
    NEED(tally_tag_sleep_info("weights", 0, &i) == 0);
    NEED(i.asleep && i.offload == 1200 * MiB);
    NEED(su_faults(a) && su_faults(b));
    NEED(tally_check() == 0);
    tally_free(big);
    tally_empty_cache(0);
    NEED(tally_wake(W, 1) == 0);
    NEED(su_same(a, 600 * MiB, 3));
    tally_free(a);
    tally_free(b);
}

static void test_wake_oom_rolls_back(void **state)
{
    (void)state;
    expect_child_ok(env_sleep, body_wake_oom_rolls_back);
}

/* Sleep waits for the work queued on the streams the tag's blocks were
 * allocated and recorded on. */
static atomic_int slept;

static void *sleeper(void *arg)
{
    (void)arg;
    intptr_t rc = tally_sleep(KV, 1, TALLY_SLEEP_OFFLOAD);
    atomic_store(&slept, 1);
    return (void *)rc;
}

static void body_sleep_waits_for_the_streams(int fd)
{
    (void)fd;
    CUcontext ctx = device0_current();
    CUstream s1, s2;
    NEED(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    NEED(cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    void *on_s1 = tagged("kv", 2 * MiB, s1), *used_on_s2 = tagged("kv", 4096, NULL);
    NEED(tally_record_stream(used_on_s2, s2) == 0);
    struct cu_hold *h1 = cu_hold(s1);
    pthread_t t;
    NEED(pthread_create(&t, NULL, sleeper, NULL) == 0);
    usleep(200 * 1000);
    NEED(!atomic_load(&slept)); /* still waiting for s1 */
    /* Meanwhile the device keeps serving other tags: the wait holds no lock. */
    void *other = tally_malloc(4096, 0, NULL);
    NEED(other != NULL);
    tally_free(other);
    struct cu_hold *h2 = cu_hold(s2);
    cu_release(h1);
    usleep(200 * 1000);
    NEED(!atomic_load(&slept)); /* and for s2, where the small block was used */
    cu_release(h2);
    tally_sleep_info_t i;
    void *rc;
    NEED(pthread_join(t, &rc) == 0 && rc == NULL);
    NEED(tally_tag_sleep_info("kv", 0, &i) == 0 && i.asleep);
    NEED(tally_wake(KV, 1) == 0);
    tally_free(on_s1);
    tally_free(used_on_s2);
    tally_empty_cache(0);
    cu.cuCtxPopCurrent(&ctx);
}

/* Sleep waits for exactly the tag's streams: each once without the lock and
 * once more under it (docs/sleep.md), and no other stream: not the default
 * stream, where the tag's blocks were never used. */
static void body_sleep_waits_only_for_its_streams(int fd)
{
    (void)fd;
    CUcontext ctx = device0_current();
    CUstream s1, s2;
    NEED(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    NEED(cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    void *a = tagged("kv", 2 * MiB, s1);
    unsigned long long before = ncalls("cuStreamSynchronize");
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD) == 0);
    NEED(ncalls("cuStreamSynchronize") - before == 2); /* s1, twice */
    NEED(tally_wake(KV, 1) == 0);
    NEED(tally_record_stream(a, s2) == 0);
    before = ncalls("cuStreamSynchronize");
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD) == 0);
    NEED(ncalls("cuStreamSynchronize") - before == 4); /* s1 and s2, twice each */
    NEED(tally_wake(KV, 1) == 0);
    tally_free(a);
    tally_empty_cache(0);
    cu.cuCtxPopCurrent(&ctx);
}

/* The other waits of a private tag: TALLY_SLEEP_SYNC_DEVICE waits for the
 * whole device; more streams than the wait set holds (64) wait for the
 * device instead of each stream; a private segment given back waits for
 * its stream's work before it is unmapped (unmap itself waits for
 * nothing). */
static void body_private_tag_device_waits(int fd)
{
    (void)fd;
    CUcontext ctx = device0_current();
    CUstream s1, many[65];
    NEED(cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    void *a = tagged("kv", 2 * MiB, s1);
    unsigned long long streams = ncalls("cuStreamSynchronize"), device = ncalls("cuCtxSynchronize");
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD | TALLY_SLEEP_SYNC_DEVICE) == 0);
    NEED(ncalls("cuStreamSynchronize") == streams && ncalls("cuCtxSynchronize") - device == 1);
    NEED(tally_wake(KV, 1) == 0);
    for (int i = 0; i < 65; i++) {
        NEED(cu.cuStreamCreate(&many[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        NEED(tally_record_stream(a, many[i]) == 0);
    }
    streams = ncalls("cuStreamSynchronize"), device = ncalls("cuCtxSynchronize");
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD) == 0);
    NEED(ncalls("cuStreamSynchronize") == streams && ncalls("cuCtxSynchronize") - device == 1); /* 66 streams */
    NEED(tally_wake(KV, 1) == 0);
    tally_free(a);
    tally_empty_cache(0);
    void *b = tagged("kv", 2 * MiB, s1);
    tally_free(b);
    streams = ncalls("cuStreamSynchronize"), device = ncalls("cuCtxSynchronize");
    unsigned long long unmaps = ncalls("cuMemUnmap");
    tally_empty_cache(0);
    NEED(ncalls("cuMemUnmap") - unmaps == 1); /* b's segment, after waiting for s1 only */
    NEED(ncalls("cuStreamSynchronize") - streams == 1 && ncalls("cuCtxSynchronize") == device);
    for (int i = 0; i < 65; i++)
        NEED(cu.cuStreamDestroy(many[i]) == CUDA_SUCCESS);
    cu.cuCtxPopCurrent(&ctx);
}

/* Past 64 streams, a tag whose block was also used on another device's
 * stream waits for that device too, not only for its own: two device
 * synchronisations, one on each device's context. */
static void body_past_64_streams_waits_for_each_device_used(int fd)
{
    (void)fd;
    CUcontext ctx = device0_current(), c1;
    CUstream many[65], other;
    void *a = tagged("kv", 2 * MiB, NULL);
    for (int i = 0; i < 65; i++) {
        NEED(cu.cuStreamCreate(&many[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        NEED(tally_record_stream(a, many[i]) == 0);
    }
    /* Device 1 used by tally (a device tally never used has no work of its
     * own to wait for), and one of its streams on a's uses. */
    NEED(cu.cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
    NEED(cu.cuCtxPushCurrent(c1) == CUDA_SUCCESS);
    NEED(cu.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    void *on1 = tally_malloc(4096, 1, other);
    NEED(on1 != NULL);
    NEED(tally_record_stream(a, other) == 0);
    NEED(cu.cuCtxPopCurrent(NULL) == CUDA_SUCCESS);
    unsigned long long streams = ncalls("cuStreamSynchronize"), device = ncalls("cuCtxSynchronize");
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD) == 0);
    NEED(ncalls("cuStreamSynchronize") == streams);
    unsigned long long synced = ncalls("cuCtxSynchronize") - device;
    if (synced != 2) {
        fprintf(stderr, "sleep past 64 streams synchronised %llu devices, expected 2 (devices 0 and 1)\n", synced);
        _exit(1);
    }
    NEED(tally_wake(KV, 1) == 0);
    tally_free(a);
    tally_free(on1);
    tally_empty_cache(0);
    tally_empty_cache(1);
    for (int i = 0; i < 65; i++)
        NEED(cu.cuStreamDestroy(many[i]) == CUDA_SUCCESS);
    cu.cuCtxPopCurrent(&ctx);
}

/* The same past 64 streams with the tag on device 1 and one of its uses on
 * a stream of device 0: device 0 is waited for too (the lowest device
 * number counts like any other). */
static void body_past_64_streams_on_device_1_waits_for_device_0_too(int fd)
{
    (void)fd;
    CUcontext ctx = device0_current(), c1;
    CUstream many[65], on0;
    /* Device 0 used by tally, and one of its streams on a's uses. */
    NEED(cu.cuStreamCreate(&on0, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    void *mine0 = tally_malloc(4096, 0, on0);
    NEED(mine0 != NULL);
    NEED(cu.cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
    NEED(cu.cuCtxPushCurrent(c1) == CUDA_SUCCESS);
    NEED(tally_tag_push("kv") == 0);
    void *a = tally_malloc(2 * MiB, 1, NULL);
    tally_tag_pop();
    NEED(a != NULL);
    for (int i = 0; i < 65; i++) {
        NEED(cu.cuStreamCreate(&many[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
        NEED(tally_record_stream(a, many[i]) == 0);
    }
    NEED(tally_record_stream(a, on0) == 0);
    unsigned long long streams = ncalls("cuStreamSynchronize"), device = ncalls("cuCtxSynchronize");
    NEED(tally_sleep(KV, 1, TALLY_SLEEP_DISCARD) == 0);
    NEED(ncalls("cuStreamSynchronize") == streams);
    unsigned long long synced = ncalls("cuCtxSynchronize") - device;
    if (synced != 2) {
        fprintf(stderr, "sleep past 64 streams on device 1 synchronised %llu devices, expected 2 (devices 1 and 0)\n",
                synced);
        _exit(1);
    }
    NEED(tally_wake(KV, 1) == 0);
    tally_free(a);
    tally_free(mine0);
    tally_empty_cache(0);
    tally_empty_cache(1);
    for (int i = 0; i < 65; i++)
        NEED(cu.cuStreamDestroy(many[i]) == CUDA_SUCCESS);
    NEED(cu.cuCtxPopCurrent(NULL) == CUDA_SUCCESS);
    NEED(cu.cuStreamDestroy(on0) == CUDA_SUCCESS);
    cu.cuCtxPopCurrent(&ctx);
}

static const char *const env_sleep2[] = {"CUDA_STANDIN_DEVICES", "2", "CUDA_STANDIN_MEMORY", "2G", "TALLY_CONF",
                                         "backend:cuda,private_tags:weights|kv,leak_report:off", NULL};

static void test_past_64_streams_sleep_waits_for_each_device_used(void **state)
{
    (void)state;
    expect_child_ok(env_sleep2, body_past_64_streams_waits_for_each_device_used);
}

static void test_past_64_streams_sleep_on_device_1_waits_for_device_0_too(void **state)
{
    (void)state;
    expect_child_ok(env_sleep2, body_past_64_streams_on_device_1_waits_for_device_0_too);
}

static void test_private_tag_waits_for_the_device_when_asked_or_past_64_streams(void **state)
{
    (void)state;
    expect_child_ok(env_sleep, body_private_tag_device_waits);
}

static void test_sleep_waits_only_for_its_streams(void **state)
{
    (void)state;
    expect_child_ok(env_sleep, body_sleep_waits_only_for_its_streams);
}

static void test_sleep_waits_for_the_streams(void **state)
{
    (void)state;
    expect_child_ok(env_sleep, body_sleep_waits_for_the_streams);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_restores_every_byte),
        cmocka_unit_test(test_discard_comes_back_empty),
        cmocka_unit_test(test_wake_oom_rolls_back),
        cmocka_unit_test(test_sleep_waits_for_the_streams),
        cmocka_unit_test(test_sleep_waits_only_for_its_streams),
        cmocka_unit_test(test_private_tag_waits_for_the_device_when_asked_or_past_64_streams),
        cmocka_unit_test(test_past_64_streams_sleep_waits_for_each_device_used),
        cmocka_unit_test(test_past_64_streams_sleep_on_device_1_waits_for_device_0_too),
    };
    return cmocka_run_group_tests_name("sleep_cuda", tests, NULL, NULL);
}
