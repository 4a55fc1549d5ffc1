/* The device lock's bias (lib/core/lock.c): a thread that keeps taking a
 * device's lock earns it and then takes it with no locked instruction;
 * another thread revokes it; the policy grows the run that earns one when
 * biases are revoked before they pay; a dead thread's record goes to the
 * next; fork leaves the child a working lock; lock_bias:false turns it off.
 * And the stress: threads taking one device in turns and at once, with a
 * bias earned after every single slow take (the policy at its most
 * eager), stamping their blocks, so two holders at once would show up as a
 * stamp overwritten, a failed tally_check or statistics off zero.
 *
 * Blocks come from the host backend (backed), so they can be written.
 * ThreadSanitizer builds have no bias (lock.c); the tests that need one
 * skip there. */
#include "testutil.h"
#include "cache/cache.h" /* tally__g and the device lock's fields (tests link libtally.a) */

#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define NO_BIAS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NO_BIAS 1
#endif
#endif

static tally_devlock_t *lock_of(int dev)
{
    return &tally__g.dev[dev]->lock;
}

static uint64_t grants(void)
{
    uint64_t g, r;
    tally__bias_counts(&g, &r);
    return g;
}

static uint64_t revokes(void)
{
    uint64_t g, r;
    tally__bias_counts(&g, &r);
    return r;
}

static void pairs(int dev, int n)
{
    for (int i = 0; i < n; i++) {
        void *p = tally_malloc(4096, dev, NULL);
        assert_non_null(p);
        tally_free(p);
    }
}

/* The policy back to its defaults on every device (one thread running). */
static int reset_policy(void **state)
{
    (void)state;
    tally__bias_policy(0, 8192);
    /* No other thread runs: take each futex lock and drop its bias. */
    for (int i = 0; i < tally__g.ndev; i++) {
        tally_devlock_t *l = lock_of(i);
        tally__devlock_slow(l);
        atomic_store(&l->owner, NULL);
        l->need = 64;
        l->streak = 0;
        tally__dev_unlock(l);
    }
    assert_int_equal(tally_configure("lock_bias:true"), 0);
    return 0;
}

static void test_one_thread_earns_the_bias_and_keeps_it(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    uint64_t g0 = grants();
    pairs(0, 64); /* 2 takes a pair: the run of 64 is earned within */
    tally_devlock_t *l = lock_of(0);
    assert_non_null(tally__bias_mine());
    assert_ptr_equal(atomic_load(&l->owner), tally__bias_mine());
    assert_int_equal(grants(), g0 + 1);
    uint64_t served = l->served;
    pairs(0, 1000);
    /* Every take of the thousand pairs went through the bias. */
    assert_int_equal(l->served - served, 2000);
    assert_int_equal(atomic_load(&tally__bias_mine()->busy), 0);
    assert_int_equal(l->fast, 0);
    assert_int_equal(grants(), g0 + 1);
    assert_int_equal(tally_check(), 0);
}

static void *other_pairs(void *arg)
{
    pairs(0, (int)(intptr_t)arg);
    return NULL;
}

static void test_another_thread_revokes_then_earns_it(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    tally_devlock_t *l = lock_of(0);
    pairs(0, 100);
    assert_ptr_equal(atomic_load(&l->owner), tally__bias_mine());
    uint64_t r0 = revokes(), g0 = grants();
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_pairs, (void *)(intptr_t)100), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(revokes(), r0 + 1);
    /* The bias revoked had served 136 takes, under the 8192 that pay for a
     * revocation: the next is four times harder to earn, and the other
     * thread's 199 further takes did not earn it. */
    assert_int_equal(l->need, 256);
    assert_int_equal(grants(), g0);
    assert_null(atomic_load(&l->owner));
    assert_int_equal(pthread_create(&t, NULL, other_pairs, (void *)(intptr_t)200), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(grants(), g0 + 1);
    tally_bias_t *theirs = atomic_load(&l->owner);
    assert_non_null(theirs);
    assert_ptr_not_equal(theirs, tally__bias_mine());
    /* This thread takes it back from the (exited) thread's record. */
    pairs(0, 10);
    assert_int_equal(revokes(), r0 + 2);
    assert_null(atomic_load(&l->owner));
    assert_int_equal(l->need, 1024);
    assert_int_equal(tally_check(), 0);
}

static void test_a_bias_that_paid_makes_the_next_easier(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    tally_devlock_t *l = lock_of(0);
    tally__bias_policy(0, 100); /* a bias pays after 100 takes */
    l->need = 512;
    pairs(0, 256);
    assert_ptr_equal(atomic_load(&l->owner), tally__bias_mine());
    pairs(0, 100);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_pairs, (void *)(intptr_t)1), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(l->need, 256);
    assert_int_equal(tally_check(), 0);
}

static tally_bias_t *exited_record;

static void *earn_on(void *arg)
{
    pairs((int)(intptr_t)arg, 100);
    exited_record = tally__bias_mine();
    return NULL;
}

static void test_a_dead_threads_record_goes_to_the_next_thread(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    /* tally_free looks for a block from the thread's last device on, so a
     * new thread's frees on device 2 look at devices 0 and 1 first, and
     * would revoke a bias there: the first thread earns device 3's. */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, earn_on, (void *)(intptr_t)3), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    tally_bias_t *first = exited_record;
    assert_non_null(first);
    /* At its thread's exit the record belongs to no thread. */
    assert_int_equal(atomic_load(&first->thread), 0);
    assert_ptr_equal(atomic_load(&lock_of(3)->owner), first);
    /* A second thread earns a bias on another device: it is given the dead
     * thread's record, and with it the bias of device 3. */
    assert_int_equal(pthread_create(&t, NULL, earn_on, (void *)(intptr_t)2), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_ptr_equal(exited_record, first);
    assert_ptr_equal(atomic_load(&lock_of(2)->owner), first);
    assert_ptr_equal(atomic_load(&lock_of(3)->owner), first);
    /* Devices 2 and 3 are still biased to the record. This thread's
     * allocation on device 3 revokes that one; its free, looking from device
     * 0 on, passes device 2 (biased to another thread: looked at last) and
     * finds the block on 3, so device 2 keeps its bias. */
    uint64_t r0 = revokes();
    pairs(3, 1);
    assert_int_equal(revokes(), r0 + 1);
    assert_null(atomic_load(&lock_of(3)->owner));
    assert_ptr_equal(atomic_load(&lock_of(2)->owner), first);
    assert_int_equal(tally_check(), 0);
}

static void *earn_again_on(void *arg)
{
    pairs((int)(intptr_t)arg, 400); /* 800 takes: past the 256 a revoked bias needs */
    exited_record = tally__bias_mine();
    return NULL;
}

/* A free looks for its block on the devices biased to other threads last
 * (lib/api/pointers.c): the block is seldom there, and taking such a lock
 * revokes the bias. When the block is there, the second pass finds it. */
static void test_a_free_passes_devices_biased_to_others(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, earn_on, (void *)(intptr_t)1), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    tally_bias_t *other = exited_record;
    assert_ptr_equal(atomic_load(&lock_of(1)->owner), other);
    pairs(0, 1); /* this thread's frees now look from device 0 on */
    uint64_t r0 = revokes();
    void *p = tally_malloc(4096, 2, NULL);
    assert_non_null(p);
    tally_free(p); /* devices 0 and 2; device 1 not taken */
    assert_int_equal(revokes(), r0);
    assert_ptr_equal(atomic_load(&lock_of(1)->owner), other);
    /* A block of device 1 itself, freed while another thread's bias is on
     * device 1 again: the first pass passes it, the second takes the lock
     * (revoking the bias) and finds the block. */
    p = tally_malloc(4096, 1, NULL); /* revokes the bias, which then needs a run 4 times as long */
    assert_non_null(p);
    assert_int_equal(pthread_create(&t, NULL, earn_again_on, (void *)(intptr_t)1), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_non_null(exited_record);
    assert_ptr_equal(atomic_load(&lock_of(1)->owner), exited_record);
    uint64_t r1 = revokes();
    tally_free(p);
    assert_int_equal(revokes(), r1 + 1);
    tally_block_info_t info;
    assert_int_not_equal(tally_block_info(p, &info), 0); /* freed */
    assert_int_equal(tally_check(), 0);
}

/* The ledger reads an allocation's tag from the bias record of the thread
 * that holds the device lock (lib/ledger/ledger.c), which tag push and pop
 * keep equal to the thread's tag stack. Each thread below writes the tag
 * names of its blocks here; the test thread checks them. */
static const char *tag_seen[6];
static tally_bias_t *tag_record;

static const char *tag_name_of(void *p)
{
    tally_block_info_t in;
    if (!p || tally_block_info(p, &in) != 0)
        return "(no block)";
    return in.tag ? tally_tag_name(in.tag) : "(untagged)";
}

static void *tags_then_bias(void *arg)
{
    (void)arg;
    /* A tag pushed before the thread has a record: the record starts
     * without one and the first allocation reads the stack. */
    tally_tag_push("early");
    pairs(3, 100); /* earns device 3's bias */
    tag_record = tally__bias_mine();
    void *p[4];
    p[0] = tally_malloc(4096, 3, NULL);
    tally_tag_push("late"); /* pushed under the bias */
    p[1] = tally_malloc(4096, 3, NULL);
    tally_tag_pop();
    p[2] = tally_malloc(4096, 3, NULL);
    tally_tag_pop();
    p[3] = tally_malloc(4096, 3, NULL);
    for (int i = 0; i < 4; i++) {
        tag_seen[i] = tag_name_of(p[i]);
        tally_free(p[i]);
    }
    tally_tag_push("left pushed"); /* the thread exits with it */
    pairs(3, 1);
    return NULL;
}

static void *untagged_takes_over(void *arg)
{
    (void)arg;
    /* Device 2, not 0 or 1: tally_free looks from the thread's last device
     * on, and would revoke device 3's bias on the way from those. */
    pairs(2, 100); /* earns device 2's bias with the dead thread's record */
    tag_record = tally__bias_mine();
    void *p = tally_malloc(4096, 3, NULL); /* device 3: still biased to that record */
    tag_seen[4] = tag_name_of(p);
    tally_free(p);
    return NULL;
}

static void test_a_biased_thread_tags_its_blocks(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, tags_then_bias, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    tally_bias_t *first = tag_record;
    assert_non_null(first);
    assert_ptr_equal(atomic_load(&lock_of(3)->owner), first);
    assert_string_equal(tag_seen[0], "early");
    assert_string_equal(tag_seen[1], "late");
    assert_string_equal(tag_seen[2], "early");
    assert_string_equal(tag_seen[3], "(untagged)");
    /* The next thread takes the dead thread's record over, and with it
     * device 3's bias, but not the tag the dead thread left pushed. */
    assert_int_equal(pthread_create(&t, NULL, untagged_takes_over, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_ptr_equal(tag_record, first);
    assert_ptr_equal(atomic_load(&lock_of(3)->owner), first);
    assert_string_equal(tag_seen[4], "(untagged)");
    assert_int_equal(tally_check(), 0);
}

static void test_lock_bias_false_never_biases(void **state)
{
    (void)state;
    assert_int_equal(tally_configure("lock_bias:false"), 0);
    tally_devlock_t *l = lock_of(3);
    uint64_t g0 = grants();
    pairs(3, 1000);
    assert_int_equal(grants(), g0);
    assert_null(atomic_load(&l->owner));
    assert_int_equal(tally_configure("lock_bias:true"), 0);
    pairs(3, 100);
#ifdef NO_BIAS
    assert_int_equal(grants() - g0, 0);
#else
    assert_int_equal(grants() - g0, 1);
#endif
}

static void test_a_bad_value_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    assert_int_not_equal(tally_configure("lock_bias:sometimes"), 0);
    HAS(tally_last_error(), "config: lock_bias: 'sometimes' is not a boolean (true/false)");
    assert_int_not_equal(tally_configure("lock_bias:false,lock_bias:1x"), 0);
    /* Neither changed the key: still on (device 3, this thread's last). */
    uint64_t g0 = grants();
    pairs(3, 100);
#ifdef NO_BIAS
    assert_int_equal(grants(), g0);
#else
    assert_int_equal(grants(), g0 + 1);
#endif
}

static void test_forked_child_takes_and_earns_the_lock(void **state)
{
    (void)state;
#ifdef NO_BIAS
    SKIP("no bias under ThreadSanitizer");
#endif
    pairs(0, 200);
    assert_ptr_equal(atomic_load(&lock_of(0)->owner), tally__bias_mine());
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child's lock is free and unbiased; the child earns it anew. */
        int bad = atomic_load(&lock_of(0)->owner) != NULL;
        pairs(0, 200);
        bad |= (atomic_load(&lock_of(0)->owner) != tally__bias_mine()) << 1;
        bad |= (tally_check() != 0) << 2;
        _exit(bad);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    /* The parent's bias survived the fork. */
    assert_ptr_equal(atomic_load(&lock_of(0)->owner), tally__bias_mine());
    pairs(0, 10);
    assert_int_equal(tally_check(), 0);
}

/* ---- stress ---------------------------------------------------------------- */

#define NWORK 4
#define SLOTS 64

static _Atomic(unsigned char *) handoff[SLOTS]; /* blocks freed by another thread */
static _Atomic long stamp_errors, check_errors;
static _Atomic int turn;

static void stamp(unsigned char *p, size_t n, unsigned char mark)
{
    memset(p, mark, n);
}

static bool stamped(const unsigned char *p, size_t n, unsigned char mark)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != mark)
            return false;
    return true;
}

typedef struct {
    int id;
    long ops;
    bool turns; /* take turns (bursts, one thread at a time) or all at once */
} work_t;

static void *stress(void *arg)
{
    work_t *w = arg;
    uint64_t rng = 0x1234567ull * (uint64_t)(w->id + 1);
    unsigned char mark = (unsigned char)(0x40 + w->id);
    unsigned char *live[16] = {0};
    size_t size[16] = {0};
    for (long i = 0; i < w->ops; i++) {
        if (w->turns) {
            /* Bursts of 200 operations, one thread after the other. */
            while (atomic_load(&turn) != w->id)
                sched_yield();
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int k = (int)(rng % 16);
        if (live[k]) {
            if (!stamped(live[k], size[k], mark))
                atomic_fetch_add(&stamp_errors, 1);
            if (rng & 0x100) {
                tally_free(live[k]);
            } else { /* hand it to whoever comes by the slot next */
                stamp(live[k], size[k], 0x11);
                unsigned char *prev = atomic_exchange(&handoff[(rng >> 9) % SLOTS], live[k]);
                if (prev)
                    tally_free(prev);
            }
            live[k] = NULL;
        } else {
            /* Mostly small-pool sizes; one in eight a large-pool block. */
            size[k] = (rng >> 40) % 8 ? 256 + (size_t)(rng >> 20) % (48 * KiB) : MiB + (size_t)(rng >> 20) % (3 * MiB);
            live[k] = tally_malloc(size[k], 0, NULL);
            if (live[k])
                stamp(live[k], size[k], mark);
        }
        /* Long holds: a release of every free segment (system calls under
         * the lock) and a walk of the whole cache. */
        if (i % 500 == 250)
            tally_empty_cache(0);
        if (i % 1000 == 999 && tally_check() != 0)
            atomic_fetch_add(&check_errors, 1);
        if (w->turns && i % 200 == 199)
            atomic_store(&turn, (w->id + 1) % NWORK);
    }
    if (w->turns)
        atomic_store(&turn, (w->id + 1) % NWORK);
    for (int k = 0; k < 16; k++)
        if (live[k]) {
            if (!stamped(live[k], size[k], mark))
                atomic_fetch_add(&stamp_errors, 1);
            tally_free(live[k]);
        }
    return NULL;
}

static void run_stress(bool turns)
{
    /* Earn a bias after every slow take, and never make it harder. */
    tally__bias_policy(1, 0);
    lock_of(0)->need = 1;
    uint64_t g0 = grants(), r0 = revokes();
    atomic_store(&turn, 0);
    atomic_store(&stamp_errors, 0);
    atomic_store(&check_errors, 0);
    pthread_t t[NWORK];
    work_t w[NWORK];
    long ops = tu_scaled(turns ? 20000 : 60000, 2000);
#ifdef NO_BIAS
    ops /= 10; /* the futex lock alone, under ThreadSanitizer: slow, and not what this file tests */
#endif
    for (int i = 0; i < NWORK; i++) {
        w[i] = (work_t){i, ops, turns};
        assert_int_equal(pthread_create(&t[i], NULL, stress, &w[i]), 0);
    }
    for (int i = 0; i < NWORK; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int s = 0; s < SLOTS; s++) {
        unsigned char *p = atomic_exchange(&handoff[s], NULL);
        if (p)
            tally_free(p);
    }
    assert_int_equal(atomic_load(&stamp_errors), 0);
    assert_int_equal(atomic_load(&check_errors), 0);
    assert_int_equal(tally_check(), 0);
    tally_stats_t st;
    assert_int_equal(tally_get_stats(0, &st), 0);
    assert_int_equal(st.allocated_bytes[TALLY_POOL_ALL].current, 0);
    assert_int_equal(st.active_bytes[TALLY_POOL_ALL].current, 0);
    print_message("  %s: %lu biases granted, %lu revoked\n", turns ? "turns" : "at once",
                  (unsigned long)(grants() - g0), (unsigned long)(revokes() - r0));
#ifndef NO_BIAS
    /* The stress exercised the bias, not only the futex lock. */
    assert_true(revokes() - r0 >= 50);
#endif
}

static void test_threads_taking_turns_keep_their_blocks_apart(void **state)
{
    (void)state;
    run_stress(true);
}

static void test_threads_at_once_keep_their_blocks_apart(void **state)
{
    (void)state;
    run_stress(false);
}

int main(void)
{
    tu_conf("backend:host,host_devices:4,host_capacity:1GiB,leak_report:off,stage_report:off");
    assert_int_equal(tally_init(), 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_one_thread_earns_the_bias_and_keeps_it, reset_policy),
        cmocka_unit_test_setup(test_another_thread_revokes_then_earns_it, reset_policy),
        cmocka_unit_test_setup(test_a_bias_that_paid_makes_the_next_easier, reset_policy),
        cmocka_unit_test_setup(test_a_dead_threads_record_goes_to_the_next_thread, reset_policy),
        cmocka_unit_test_setup(test_a_free_passes_devices_biased_to_others, reset_policy),
        cmocka_unit_test_setup(test_a_biased_thread_tags_its_blocks, reset_policy),
        cmocka_unit_test_setup(test_lock_bias_false_never_biases, reset_policy),
        cmocka_unit_test_setup(test_a_bad_value_is_refused_and_changes_nothing, reset_policy),
        cmocka_unit_test_setup(test_forked_child_takes_and_earns_the_lock, reset_policy),
        cmocka_unit_test_setup(test_threads_taking_turns_keep_their_blocks_apart, reset_policy),
        cmocka_unit_test_setup(test_threads_at_once_keep_their_blocks_apart, reset_policy),
    };
    return cmocka_run_group_tests_name("lock_bias", tests, NULL, NULL);
}
