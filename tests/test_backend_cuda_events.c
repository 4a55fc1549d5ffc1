/* The cuda and async backends when a block is used on other streams
 * (record_stream): the events tally records for a freed block, on the
 * block's device or another's, what a free waits for, and what becomes of
 * events that fail or have completed. On the CUDA stand-in under `make
 * test`, or the real driver with TALLY_REAL_CUDA=1; every test runs in a
 * forked child with its own TALLY_CONF (tests/cudachild.h), as in
 * test_backend_cuda.c.
 *
 * Defects of issue 11 and their tests:
 *   cross-device record_stream         test_cuda_cross_device_record_stream,
 *                                      test_async_cross_device_record_stream
 *   async free not waiting on uses     test_async_free_waits_on_uses (through a free stream)
 *   failed sync                        test_cuda_failed_event_frees_block
 *   failed record syncs the device     test_cuda_failed_record_waits_for_stream_only
 *   completed events kept for reuse    test_cuda_completed_events_are_reused
 *   64 spare events per device         test_cuda_cross_device_events_kept_up_to_64
 *
 * Gaps that mutation testing found (tests/mutate/mutations.txt):
 *   free not waiting on its own stream test_async_free_waits_on_own_stream */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include "cudachild.h"

/* ---- streams of other devices ------------------------------------------------ */

/* A block of device 0 used on a stream of device 1: its event is recorded on
 * device 1 and the block is not reused while that stream still works. NULL
 * with device 1's context current means device 1's default stream. */
static void body_cross_device(void)
{
    driver_up();
    CUstream s1 = make_stream(1);
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    struct cu_hold *h = cu_hold(s1);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    tally_free(p);
    void *q = tally_malloc(1 << 20, 0, NULL);
    EXPECT(q != NULL);
    if (is_cuda())
        EXPECT(q != p);
    cu_release(h);
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    tally_free(q);
    void *r = tally_malloc(1 << 20, 0, NULL);
    if (is_cuda())
        EXPECT(r == p);
    /* NULL: the default stream of the current context's device (1). */
    CUdevice d1;
    CUcontext c1, popped;
    CU_EXPECT(cu.cuDeviceGet(&d1, 1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRetain(&c1, d1));
    CU_EXPECT(cu.cuCtxPushCurrent(c1));
    h = cu_hold(NULL);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(r, NULL) == 0);
    CU_EXPECT(cu.cuCtxPopCurrent(&popped));
    tally_free(r);
    void *t = tally_malloc(1 << 20, 0, NULL);
    EXPECT(t != NULL);
    if (is_cuda())
        EXPECT(t != r);
    cu_release(h);
    tally_free(t);
    EXPECT(tally_check() == 0);
    EXPECT(cu_ctx_active(2) == 0);
}

/* async: a block used on another stream is freed on the device's free
 * stream, which waits for that stream (hold_own false: s1 held) and for the
 * block's own stream (hold_own true: s0 held); until the held work has run,
 * another stream gets the block only by waiting for it. */
static void async_free_waits(bool hold_own)
{
    driver_up();
    CUstream s0 = make_stream(0), s2 = make_stream(0), s1 = make_stream(1);
    CUstream held = hold_own ? s0 : s1;
    void *p = tally_malloc(1 << 20, 0, s0);
    EXPECT(p != NULL);
    struct cu_hold *h = cu_hold(held);
    EXPECT(h != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    tally_free(p);
    if (!hold_own) {
        /* The compute stream is not held back by s1. */
        for (int i = 0; i < 100 && cu.cuStreamQuery(s0) == CUDA_ERROR_NOT_READY; i++)
            usleep(2000);
        EXPECT(cu.cuStreamQuery(s0) == CUDA_SUCCESS);
    }
    usleep(20000); /* a free that did not wait for the held stream would have run by now */
    void *q = tally_malloc(1 << 20, 0, s2);
    EXPECT(q != NULL);
    if (q == p)
        EXPECT(cu.cuStreamQuery(s2) == CUDA_ERROR_NOT_READY); /* s2 waits for the held stream */
    cu_release(h);
    CU_EXPECT(cu.cuStreamSynchronize(held));
    CU_EXPECT(cu.cuStreamSynchronize(s2));
    tally_free(q);
    EXPECT(tally_check() == 0);
}

static void body_async_free_waits(void)
{
    async_free_waits(false);
}

static void body_async_free_waits_own(void)
{
    async_free_waits(true);
}

/* ---- events ----------------------------------------------------------------- */

/* An event whose query fails does not leave its block pending for ever:
 * tally synchronises the event's device and frees the block. The query is
 * made to fail by resetting device 1's primary context under tally (the
 * test releases every reference, tally's included): tally's event of that
 * device becomes an invalid handle. */
static void body_failed_event(void)
{
    driver_up();
    CUstream s1 = make_stream(1); /* one reference to device 1's context */
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    tally_free(p); /* tally records its event on device 1 (a second reference) */
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRelease(1));
    CU_EXPECT(cu.cuDevicePrimaryCtxRelease(1));
    EXPECT(cu_ctx_active(1) == 0);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active[0].current == 1); /* p is still pending */
    long long device_syncs = cu_calls("cuCtxSynchronize");
    void *q = tally_malloc(1 << 20, 0, NULL);
    EXPECT(q != NULL);
    EXPECT(q == p); /* the failed query freed it */
    if (device_syncs >= 0) /* after waiting for the event's device (the stand-in counts calls) */
        EXPECT(cu_calls("cuCtxSynchronize") - device_syncs == 1);
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.active[0].current == 1);
    tally_free(q);
    EXPECT(tally_check() == 0);
}

/* An event tally recorded for a freed block is kept once it has completed
 * and serves the next free that needs one: twenty rounds of allocate,
 * record_stream, free and wait create one event, not twenty (on a real
 * driver, which counts nothing, only the frees are checked). */
static void body_events_reused(void)
{
    driver_up();
    CUstream s1 = make_stream(0);
    long long made = cu_calls("cuEventCreate");
    for (int i = 0; i < 20; i++) {
        void *p = tally_malloc(1 << 20, 0, NULL);
        EXPECT(p != NULL);
        EXPECT(tally_record_stream(p, s1) == 0);
        tally_free(p); /* an event on s1 holds the block */
        CU_EXPECT(cu.cuStreamSynchronize(s1));
    }
    if (made >= 0)
        EXPECT(cu_calls("cuEventCreate") - made == 1);
    tally_stats_t st;
    EXPECT(tally_get_stats(0, &st) == 0);
    EXPECT(st.allocation[0].allocated == 20);
    EXPECT(tally_check() == 0);
}

/* Events of another device go back to the backend, which keeps 64 spares
 * per device and destroys the rest: 70 blocks of device 0 used on a
 * stream of device 1 and freed take 70 events of device 1; once they have
 * completed, 64 are kept and 6 destroyed, and the next 64 such frees
 * create none. */
static void body_cross_device_spares(void)
{
    driver_up();
    CUstream s1 = make_stream(1);
    void *p[70];
    long long made = cu_calls("cuEventCreate"), gone = cu_calls("cuEventDestroy");
    for (int i = 0; i < 70; i++) {
        p[i] = tally_malloc(1 << 20, 0, NULL);
        EXPECT(p[i] != NULL);
        EXPECT(tally_record_stream(p[i], s1) == 0);
    }
    for (int i = 0; i < 70; i++)
        tally_free(p[i]);
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    tally_empty_cache(0); /* completed events are collected first */
    if (made >= 0) {
        EXPECT(cu_calls("cuEventCreate") - made == 70);
        EXPECT(cu_calls("cuEventDestroy") - gone == 6);
    }
    made = cu_calls("cuEventCreate");
    for (int i = 0; i < 64; i++) {
        p[i] = tally_malloc(1 << 20, 0, NULL);
        EXPECT(p[i] != NULL);
        EXPECT(tally_record_stream(p[i], s1) == 0);
    }
    for (int i = 0; i < 64; i++)
        tally_free(p[i]);
    if (made >= 0)
        EXPECT(cu_calls("cuEventCreate") == made);
    CU_EXPECT(cu.cuStreamSynchronize(s1));
    EXPECT(tally_check() == 0);
}

struct watchdog {
    struct cu_hold *hold;
    _Atomic int fired; /* read by the test while the watchdog may write it */
};

static void *watchdog_main(void *arg)
{
    struct watchdog *w = arg;
    usleep(2000000);
    atomic_store(&w->fired, 1);
    cu_release(w->hold);
    return NULL;
}

/* An event that cannot be recorded (its stream was destroyed since
 * record_stream) makes tally wait for that stream only: not for the
 * block's device, whose other stream is held here (waiting for the device
 * would last until the watchdog lets it go). */
static void body_failed_record_waits_for_stream_only(void)
{
    driver_up();
    CUstream s1 = make_stream(1), busy = make_stream(0);
    void *p = tally_malloc(1 << 20, 0, NULL);
    EXPECT(p != NULL);
    EXPECT(tally_record_stream(p, s1) == 0);
    CU_EXPECT(cu.cuStreamDestroy(s1));
    struct watchdog w = {cu_hold(busy), 0};
    EXPECT(w.hold != NULL);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, watchdog_main, &w) == 0);
    tally_free(p); /* the record on s1 fails */
    EXPECT(!atomic_load(&w.fired));
    EXPECT(pthread_join(t, NULL) == 0);
    CU_EXPECT(cu.cuStreamSynchronize(busy));
    EXPECT(tally_check() == 0);
}

/* ---- tests ------------------------------------------------------------------ */

CUDA_TEST(test_cuda_cross_device_record_stream, "backend:cuda,leak_report:off", body_cross_device, 3)
CUDA_TEST(test_async_cross_device_record_stream, "backend:async,leak_report:off", body_cross_device, 3)
CUDA_TEST(test_async_free_waits_on_uses, "backend:async,leak_report:off", body_async_free_waits, 2)
CUDA_TEST(test_async_free_waits_on_own_stream, "backend:async,leak_report:off", body_async_free_waits_own, 2)
CUDA_TEST(test_cuda_failed_event_frees_block, "backend:cuda,leak_report:off", body_failed_event, 2)
CUDA_TEST(test_cuda_completed_events_are_reused, "backend:cuda,leak_report:off", body_events_reused, 1)
CUDA_TEST(test_cuda_cross_device_events_kept_up_to_64, "backend:cuda,leak_report:off", body_cross_device_spares, 2)
CUDA_TEST(test_cuda_failed_record_waits_for_stream_only, "backend:cuda,leak_report:off",
          body_failed_record_waits_for_stream_only, 2)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_cross_device_record_stream),
        cmocka_unit_test(test_async_cross_device_record_stream),
        cmocka_unit_test(test_async_free_waits_on_uses),
        cmocka_unit_test(test_async_free_waits_on_own_stream),
        cmocka_unit_test(test_cuda_failed_event_frees_block),
        cmocka_unit_test(test_cuda_completed_events_are_reused),
        cmocka_unit_test(test_cuda_cross_device_events_kept_up_to_64),
        cmocka_unit_test(test_cuda_failed_record_waits_for_stream_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
