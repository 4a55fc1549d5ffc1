/* make demo-sleep: one simulated 1 GiB device shared by a rollout engine and a
 * trainer, as RL post-training does (docs/sleep.md). The engine's weights
 * (256 MiB) and KV cache (256 MiB) are private tags; before each training
 * phase the weights sleep with offload and the cache with discard, so the
 * trainer's 640 MiB fit; after it both wake, the weights byte for byte at the
 * same addresses. Three cycles; every step prints the device's reserved
 * memory and each tag's state, and the stage reports say what slept and woke.
 * Writes the JSON report (with the timeline) to the path given, or
 * demo-sleep.json: `build/bin/tally plot demo-sleep.json -o demo-sleep.html`
 * shows the sleeps and wakes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tally.h"

#define MiB ((size_t)1 << 20)
static const char *WEIGHTS[] = {"weights"}, *CACHE[] = {"kv_cache"};

static void to_stdout(void *arg, const char *text, size_t len)
{
    (void)arg;
    fwrite(text, 1, len, stdout);
}

static void must(int rc, const char *what)
{
    if (rc) {
        fprintf(stderr, "demo-sleep: %s: %s\n", what, tally_last_error());
        exit(1);
    }
}

static void *take(const char *tag, size_t size)
{
    if (tag)
        must(tally_tag_push(tag), "tag");
    void *p = tally_malloc(size, 0, NULL);
    if (tag)
        tally_tag_pop();
    if (!p) {
        fprintf(stderr, "demo-sleep: %zu MiB under %s: %s\n", size / MiB, tag ? tag : "untagged", tally_last_error());
        exit(1);
    }
    return p;
}

static void step(const char *what)
{
    tally_stats_t s;
    must(tally_get_stats(0, &s), "stats");
    tally_sleep_info_t w, k;
    must(tally_tag_sleep_info("weights", 0, &w), "info");
    must(tally_tag_sleep_info("kv_cache", 0, &k), "info");
    printf("%-34s reserved %4lld MiB | weights %-9s mapped %3llu MiB, offload %3llu MiB | kv_cache %-9s mapped %3llu "
           "MiB\n",
           what, (long long)(s.reserved_bytes[0].current / (int64_t)MiB), w.asleep ? "asleep" : "awake",
           (unsigned long long)(w.reserved / MiB), (unsigned long long)(w.offload / MiB),
           k.asleep ? "asleep" : "awake", (unsigned long long)(k.reserved / MiB));
}

int main(int argc, char **argv)
{
    const char *report = argc > 1 ? argv[1] : "demo-sleep.json";
    char conf[700];
    snprintf(conf, sizeof conf,
             "backend:host,host_capacity:1GiB,private_tags:weights|kv_cache,persistent_tags:weights|kv_cache,"
             "timeline:true,leak_report:off,report_path:%s",
             report);
    must(tally_configure(conf), "configure");
    const char *env = getenv("TALLY_CONF");
    if (env && *env)
        must(tally_configure(env), "TALLY_CONF");
    must(tally_init(), "init");
    printf("One 1 GiB device: a rollout engine (private tags weights and kv_cache) and a trainer take turns.\n\n");
    must(tally_stage_begin("load"), "stage");
    void *w[8];
    for (int i = 0; i < 8; i++) {
        w[i] = take("weights", 32 * MiB);
        memset(w[i], 'A' + i, 32 * MiB);
    }
    must(tally_stage_end("load"), "stage");
    step("loaded weights");
    for (int cycle = 1; cycle <= 3; cycle++) {
        char name[32];
        snprintf(name, sizeof name, "rollout-%d", cycle);
        must(tally_stage_begin(name), "stage");
        void *kv[4];
        for (int i = 0; i < 4; i++)
            kv[i] = take("kv_cache", 64 * MiB);
        step("rollout: cache filled");
        must(tally_sleep(WEIGHTS, 1, TALLY_SLEEP_OFFLOAD), "sleep weights");
        must(tally_sleep(CACHE, 1, TALLY_SLEEP_DISCARD), "sleep kv_cache");
        must(tally_stage_end(name), "stage");
        step("weights offloaded, cache discarded");
        snprintf(name, sizeof name, "train-%d", cycle);
        must(tally_stage_begin(name), "stage");
        void *t = take("trainer", 640 * MiB);
        step("trainer holds 640 MiB");
        tally_free(t);
        tally_empty_cache(0);
        must(tally_wake(WEIGHTS, 1), "wake weights");
        must(tally_wake(CACHE, 1), "wake kv_cache");
        must(tally_stage_end(name), "stage");
        for (int i = 0; i < 8; i++)
            for (size_t b = 0; b < 32 * MiB; b += 4096)
                if (((char *)w[i])[b] != 'A' + i) {
                    fprintf(stderr, "demo-sleep: weights block %d differs after wake\n", i);
                    return 1;
                }
        step("woken: weights restored");
        for (int i = 0; i < 4; i++)
            tally_free(kv[i]);
    }
    printf("\n");
    must(tally_write_ledger(to_stdout, NULL), "ledger");
    for (int i = 0; i < 8; i++)
        tally_free(w[i]);
    printf("\nThe report (%s, at exit) has the timeline: build/bin/tally plot %s -o demo-sleep.html\n", report, report);
    return 0;
}
