/* Private tags, sleep and wake on the host backend (docs/sleep.md): the
 * errors. Every refusal is one line and changes nothing (a second sleep or
 * wake, a tag that is not private, blocks from before it became private,
 * in a graph pool, under a capture, an allocation under a sleeping tag;
 * base_alloc of its memory, which CUDA IPC cannot share); a wake out of memory or over the memory fraction rolls
 * back; in children with other configurations, offload on host_mode:virtual,
 * the async backend, private tag names that are empty or too long and a
 * 65th private tag are refused. The rest of sleep and wake is in test_api_sleep.c.
 *
 * Two simulated 1 GiB devices in backed mode (contents are real), with kv
 * and weights private through the configuration (tests/sleephostutil.h). */
#include "sleephostutil.h"

/* ---- errors ----------------------------------------------------------------------------- */

static void test_second_sleep_and_wake_do_nothing(void **state)
{
    (void)state;
    void *a = tagged("kv", 2 * MB, 0);
    tally_sleep_info_t was = info("kv", 0);
    LU_OK(tally_sleep(KV, 1, 0));
    lu_cap_begin();
    LU_OK(tally_sleep(KV, 1, 0));
    LU_HAS(lu_cap_text(), "tally_sleep: tag 'kv' is already asleep: nothing done");
    LU_EQ(lu_cap_lines(), 1);
    LU_OK(tally_wake(KV, 1));
    lu_cap_begin();
    LU_OK(tally_wake(KV, 1));
    LU_HAS(lu_cap_text(), "tally_wake: tag 'kv' is awake: nothing done");
    LU_EQ(lu_cap_lines(), 1);
    lu_cap_end();
    LU_EQ(info("kv", 0).sleeps, was.sleeps + 1);
    LU_EQ(info("kv", 0).wakes, was.wakes + 1);
    tally_free(a);
}

static void test_not_private_is_refused(void **state)
{
    (void)state;
    void *a = tagged("shared-tag", 2 * MB, 0);
    int64_t r = reserved(0);
    const char *t[] = {"shared-tag"};
    lu_cap_begin();
    LU_EQ(tally_sleep(t, 1, 0), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "tally_sleep: tag 'shared-tag' is not private: its blocks may share pages");
    LU_EQ(lu_cap_lines(), 1);
    /* Checked before anything sleeps: kv stays awake. */
    const char *mixed[] = {"kv", "shared-tag"};
    void *k = tagged("kv", 2 * MB, 0);
    LU_EQ(tally_sleep(mixed, 2, 0), -TALLY_EINVAL);
    LU_EQ(info("kv", 0).asleep, 0);
    LU_EQ(tally_wake(t, 1), -TALLY_EINVAL);
    LU_EQ(tally_sleep(NULL, 1, 0), -TALLY_EINVAL);
    LU_EQ(tally_sleep(KV, 0, 0), -TALLY_EINVAL);
    LU_EQ(tally_sleep(KV, 1, 8), -TALLY_EINVAL);
    LU_HAS(tally_last_error(), "unknown flags");
    lu_cap_end();
    assert_true(reserved(0) >= r);
    tally_free(a);
    tally_free(k);
    LU_CHECK_OK();
}

static void test_blocks_from_before_private_are_refused(void **state)
{
    (void)state;
    void *early = tagged("became-private", 2 * MB, 0);
    LU_OK(tally_tag_set_private("became-private"));
    void *later = tagged("became-private", 2 * MB, 0);
    const char *t[] = {"became-private"};
    LU_EQ(tally_sleep(t, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "was allocated before the tag became private");
    LU_EQ(info("became-private", 0).asleep, 0);
    tally_free(early);
    LU_OK(tally_sleep(t, 1, 0));
    LU_OK(tally_wake(t, 1));
    tally_free(later);
    LU_CHECK_OK();
}

static int accept_all(void *arg, void *stream)
{
    (void)arg, (void)stream;
    return 1;
}

static void test_graph_pool_blocks_are_refused(void **state)
{
    (void)state;
    LU_OK(tally_graph_pool_begin(0, 7, 9, accept_all, NULL));
    void *g = tagged("kv", 2 * MB, 0); /* the graph's pool wins */
    LU_OK(tally_graph_pool_end(0, 7, 9));
    LU_EQ(tally_sleep(KV, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "belongs to a CUDA graph's pool (7, 9)");
    tally_free(g);
    LU_OK(tally_graph_pool_release(0, 7, 9));
    LU_CHECK_OK();
}

/* Between tally_graph_pool_begin and _end a capture is taken to be under
 * way (announced): no private tag sleeps then, on any device. */
static void test_capture_under_way_is_refused(void **state)
{
    (void)state;
    void *k = tagged("kv", 2 * MB, 1);
    LU_OK(tally_graph_pool_begin(0, 3, 4, accept_all, NULL));
    LU_EQ(tally_sleep(KV, 1, 0), -TALLY_ESTATE);
    LU_HAS(tally_last_error(), "tally_sleep: tag 'kv' cannot sleep: a CUDA graph capture is under way on device 0");
    LU_EQ(info("kv", 1).asleep, 0);
    LU_OK(tally_graph_pool_end(0, 3, 4));
    LU_OK(tally_graph_pool_release(0, 3, 4));
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

/* A private tag's memory is pages of the virtual memory API, which CUDA IPC
 * cannot share: tally_torch_base_alloc (PyTorch's base_alloc, asked before
 * cudaIpcGetMemHandle) refuses it with the reason and marks nothing, so the
 * tag still sleeps; an untagged block's segment is handed out. */
static void test_ipc_base_of_a_private_tag_is_refused(void **state)
{
    (void)state;
    void *k = tagged("kv", 2 * MB, 1);
    size_t sz = 7;
    assert_null(tally_torch_base_alloc(k, &sz));
    assert_int_equal(sz, 0);
    LU_HAS(tally_last_error(), "which CUDA IPC (cudaIpcGetMemHandle) cannot share");
    LU_HAS(tally_last_error(), "a private tag");
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_wake(KV, 1));
    void *u = lu_malloc(2 * MB, 1);
    char *base = tally_torch_base_alloc(u, &sz);
    assert_true(base && (char *)u >= base && (char *)u < base + sz);
    tally_free(u);
    tally_free(k);
}

static void test_allocation_under_a_sleeping_tag(void **state)
{
    (void)state;
    void *a = tagged("kv", 2 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_tag_push("kv"));
    assert_null(tally_malloc(4096, 0, NULL));
    LU_HAS(tally_last_error(), "tally_malloc: tag 'kv' is asleep on device 0: wake it first");
    LU_EQ(info("kv", 0).asleep, 1);
    LU_OK(tally_configure("sleep_alloc:wake"));
    lu_cap_begin();
    void *b = tally_malloc(4096, 0, NULL);
    lu_cap_end();
    tally_tag_pop();
    assert_non_null(b);
    LU_HAS(lu_cap_text(), "waking it for an allocation (sleep_alloc:wake)");
    LU_EQ(info("kv", 0).asleep, 0);
    tally_free(a);
    tally_free(b);
    LU_CHECK_OK();
}

static void test_free_of_a_sleeping_block_drops_its_backup(void **state)
{
    (void)state;
    void *a = tagged("weights", 8 * MB, 0), *b = tagged("weights", 12 * MB, 0);
    su_fill(b, 12 * MB, 9);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    LU_EQ(info("weights", 0).offload, 20 * MB);
    tally_free(a);
    LU_EQ(info("weights", 0).offload, 12 * MB);
    LU_EQ(info("weights", 0).sleeping_blocks, 1);
    LU_CHECK_OK();
    LU_OK(tally_wake(W, 1));
    assert_true(su_same(b, 12 * MB, 9));
    tally_free(b);
    LU_CHECK_OK();
}

static void test_wake_out_of_memory_rolls_back(void **state)
{
    (void)state;
    void *w = tagged("weights", 300 * MB, 1);
    su_fill(w, 300 * MB, 5);
    LU_OK(tally_sleep(W, 1, TALLY_SLEEP_OFFLOAD));
    int64_t r = reserved(1);
    /* Another tag takes the room while weights sleep. */
    void *big = lu_malloc(800 * MB, 1);
    lu_cap_begin();
    LU_EQ(tally_wake(W, 1), -TALLY_ENOMEM);
    lu_cap_end();
    LU_HAS(tally_last_error(), "tally_wake: tag 'weights' on device 1: out of memory");
    LU_HAS(tally_last_error(), "missing");
    LU_HAS(tally_last_error(), "it stays asleep with its backup");
    assert_null(strchr(tally_last_error(), '\n'));
    LU_EQ(reserved(1), r + 800 * (int64_t)MB);
    tally_sleep_info_t i = info("weights", 1);
    LU_EQ(i.asleep, 1);
    LU_EQ(i.offload, 300 * MB);
    assert_true(su_faults(w));
    LU_CHECK_OK();
    tally_free(big);
    tally_empty_cache(1);
    LU_OK(tally_wake(W, 1));
    assert_true(su_same(w, 300 * MB, 5));
    tally_free(w);
    LU_CHECK_OK();
}

static void test_memory_fraction_bounds_a_wake(void **state)
{
    (void)state;
    void *k = tagged("kv", 100 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_OK(tally_set_memory_fraction(0.05, 0)); /* about 51 MiB */
    LU_EQ(tally_wake(KV, 1), -TALLY_ENOMEM);
    LU_HAS(tally_last_error(), "memory fraction limit");
    LU_EQ(info("kv", 0).asleep, 1);
    LU_OK(tally_set_memory_fraction(1.0, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

/* The fraction is a bound, not a strict one: a wake that brings reserved
 * memory to exactly the limit succeeds (as an allocation that does). A
 * 100 MiB kv segment on the 1 GiB device, asleep; a limit of reserved +
 * 100 MiB (an exact fraction: 1 GiB is a power of two) lets it wake, and
 * one 2 MiB less does not. */
static void test_wake_up_to_exactly_the_fraction(void **state)
{
    (void)state;
    void *k = tagged("kv", 100 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    int64_t r = reserved(0);
    LU_OK(tally_set_memory_fraction((double)(r + 98 * (int64_t)MB) / (double)(1024 * MB), 0));
    lu_cap_begin();
    LU_EQ(tally_wake(KV, 1), -TALLY_ENOMEM);
    lu_cap_end();
    LU_HAS(tally_last_error(), "out of memory, 2.0 MiB missing (memory fraction limit of 102760448 bytes reached)");
    LU_EQ(info("kv", 0).asleep, 1);
    LU_OK(tally_set_memory_fraction((double)(r + 100 * (int64_t)MB) / (double)(1024 * MB), 0));
    LU_OK(tally_wake(KV, 1));
    LU_EQ(info("kv", 0).asleep, 0);
    LU_EQ(reserved(0), r + 100 * (int64_t)MB);
    LU_OK(tally_set_memory_fraction(1.0, 0));
    tally_free(k);
    LU_CHECK_OK();
}

/* What a wake stopped by the fraction is missing: all it needs when the
 * limit leaves no room (a fraction of 0 here), to the byte: 1 GiB, not a
 * byte less ("1024.0 MiB"). */
static void test_wake_with_no_room_under_the_fraction_misses_all_it_needs(void **state)
{
    (void)state;
    void *k = tagged("kv", 1024 * MB, 0);
    LU_OK(tally_sleep(KV, 1, 0));
    LU_EQ(reserved(0), 0);
    LU_OK(tally_set_memory_fraction(0.0, 0));
    lu_cap_begin();
    LU_EQ(tally_wake(KV, 1), -TALLY_ENOMEM);
    lu_cap_end();
    LU_HAS(tally_last_error(), "out of memory, 1.0 GiB missing (memory fraction limit of 0 bytes reached)");
    LU_OK(tally_set_memory_fraction(1.0, 0));
    LU_OK(tally_wake(KV, 1));
    tally_free(k);
    LU_CHECK_OK();
}

/* ---- children: other configurations ------------------------------------------------------ */

static int child_virtual_offload(void)
{
    tally_set_sink(lu_null_sink, NULL);
    LU_REQUIRE(tally_init() == 0);
    LU_OK(tally_tag_push("kv"));
    void *p = tally_malloc(4 * MB, 0, NULL);
    tally_tag_pop();
    LU_REQUIRE(p != NULL);
    int rc = tally_sleep(KV, 1, TALLY_SLEEP_OFFLOAD);
    printf("rc=%d %s\n", rc, tally_last_error());
    tally_sleep_info_t i;
    tally_tag_sleep_info("kv", 0, &i);
    printf("asleep=%d\n", i.asleep);
    rc = tally_sleep(KV, 1, TALLY_SLEEP_DISCARD);
    printf("discard=%d\n", rc);
    return 0;
}

static void test_virtual_mode_refuses_offload(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "virtual", "backend:host,host_mode:virtual,private_tags:kv", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "rc=-4 tally_sleep: tag 'kv' on device 0: host_mode:virtual holds no contents");
    LU_HAS(c.out, "(nothing of it was unmapped)");
    LU_HAS(c.out, "asleep=0");
    LU_HAS(c.out, "discard=0");
    lu_child_free(&c);
}

static int child_async(void)
{
    int rc = tally_init();
    printf("init=%d %s\n", rc, tally_last_error());
    return 0;
}

static int child_async_runtime(void)
{
    tally_set_sink(lu_null_sink, NULL);
    int rc = tally_tag_set_private("kv2");
    printf("set=%d %s\n", rc, tally_last_error());
    return 0;
}

static void test_async_backend_refuses_private_tags(void **state)
{
    (void)state;
    lu_child_t c;
    lu_child_run(&c, "async", "backend:async,private_tags:kv", NULL);
    LU_CHILD_EXIT(&c, 0);
    if (strstr(c.out, "unusable")) {
        lu_child_free(&c);
        skip(); /* no CUDA stand-in or driver here */
    }
    LU_HAS(c.out, "init=-3 private_tags: backend async passes allocations through to CUDA's stream-ordered pools");
    lu_child_free(&c);
    lu_child_run(&c, "async-runtime", "backend:async", NULL);
    LU_CHILD_EXIT(&c, 0);
    LU_HAS(c.out, "set=-5 tally_tag_set_private: 'kv2': backend async passes allocations through");
    lu_child_free(&c);
}

/* private_tags names are 1 to 200 bytes, as every tag name: an empty name or
 * a longer one is refused at initialisation with one line that gives the
 * reason first (the list may be long), and nothing is made private ("kv|",
 * a list ended by its separator, is kv alone). A child
 * per list (the key is read once, at start). */
static int child_init_only(void)
{
    tally_set_sink(lu_null_sink, NULL);
    int rc = tally_init();
    printf("init=%d %s\n", rc, rc ? tally_last_error() : "");
    return 0;
}

static void test_private_tag_names_empty_or_overlong_refused(void **state)
{
    (void)state;
    char name[400], conf[500];
    memset(name, 'n', sizeof name);
    static const size_t lens[] = {200, 201, 255, 256, 300};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        name[lens[i]] = 0;
        snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,private_tags:kv|%s|w", name);
        lu_child_t c;
        lu_child_run(&c, "init-only", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        if (lens[i] == 200)
            LU_HAS(c.out, "init=0 \n");
        else
            LU_HAS(c.out, "init=-3 private_tags: tag name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn...' is longer "
                          "than 200 characters\n");
        lu_child_free(&c);
        name[lens[i]] = 'n';
    }
    static const char *const empty[] = {"kv||w", "|kv"}; /* a trailing | ends the list */
    for (size_t i = 0; i < 2; i++) {
        char want[100];
        snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,private_tags:%s", empty[i]);
        lu_child_t c;
        lu_child_run(&c, "init-only", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        snprintf(want, sizeof want, "init=-3 private_tags: an empty tag name in '%s'\n", empty[i]);
        LU_HAS(c.out, want);
        lu_child_free(&c);
    }
}

/* At most 64 tags can be private (one process-wide list, read without a
 * lock on every allocation). In the configuration, the 65th name fails
 * initialisation naming it; listing 64 is accepted. */
static void test_private_tags_past_64_refused_in_the_configuration(void **state)
{
    (void)state;
    for (int n = 64; n <= 65; n++) {
        char conf[1200];
        int at = snprintf(conf, sizeof conf, "backend:host,host_mode:virtual,private_tags:");
        for (int i = 0; i < n; i++)
            at += snprintf(conf + at, sizeof conf - (size_t)at, "%st%d", i ? "|" : "", i);
        lu_child_t c;
        lu_child_run(&c, "init-only", conf, NULL);
        LU_CHILD_EXIT(&c, 0);
        LU_HAS(c.out, n == 64 ? "init=0 \n" : "init=-3 private_tags: 't64': at most 64 tags can be private\n");
        lu_child_free(&c);
    }
}

/* Through tally_tag_set_private: new tags are accepted until the list is
 * full (kv, weights and those earlier tests made private are in it), then
 * the next is refused with -TALLY_ESTATE naming it, changes nothing and is
 * not private; one already private is still accepted. Runs last: the list
 * stays full. (The exact count, 64, is the configuration test's.) */
static void test_private_tags_past_64_refused_by_the_call(void **state)
{
    (void)state;
    char name[16];
    int accepted = 0, rc = 0;
    for (; accepted < 70; accepted++) {
        snprintf(name, sizeof name, "p%d", accepted);
        if ((rc = tally_tag_set_private(name)) != 0)
            break;
    }
    LU_EQ(rc, -TALLY_ESTATE);
    assert_in_range(accepted, 58, 62); /* 64 less the few already private */
    char want[120];
    snprintf(want, sizeof want, "tally_tag_set_private: '%s': at most 64 tags can be private", name);
    LU_HAS(tally_last_error(), want);
    LU_EQ(tally_tag_is_private(name), 0);
    LU_EQ(tally_tag_set_private("one_more"), -TALLY_ESTATE);
    LU_EQ(tally_tag_is_private("p0"), 1);
    LU_OK(tally_tag_set_private("kv"));
    LU_OK(tally_tag_set_private("p0"));
}

int main(int argc, char **argv)
{
    static const lu_role_t roles[] = {{"virtual", child_virtual_offload},
                                      {"init-only", child_init_only},
                                      {"async", child_async},
                                      {"async-runtime", child_async_runtime},
                                      {NULL, NULL}};
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    const struct CMUnitTest tests[] = {
        T(test_second_sleep_and_wake_do_nothing),
        T(test_not_private_is_refused),
        T(test_blocks_from_before_private_are_refused),
        T(test_graph_pool_blocks_are_refused),
        T(test_capture_under_way_is_refused),
        T(test_ipc_base_of_a_private_tag_is_refused),
        T(test_allocation_under_a_sleeping_tag),
        T(test_free_of_a_sleeping_block_drops_its_backup),
        T(test_wake_out_of_memory_rolls_back),
        T(test_memory_fraction_bounds_a_wake),
        T(test_wake_up_to_exactly_the_fraction),
        T(test_wake_with_no_room_under_the_fraction_misses_all_it_needs),
        T(test_virtual_mode_refuses_offload),
        T(test_async_backend_refuses_private_tags),
        T(test_private_tag_names_empty_or_overlong_refused),
        T(test_private_tags_past_64_refused_in_the_configuration),
        T(test_private_tags_past_64_refused_by_the_call), /* last: it fills the list */
    };
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    setenv("TALLY_CONF", CONF, 1);
    int failed = cmocka_run_group_tests_name("sleep_errors", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
