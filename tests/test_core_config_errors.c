/* Configuration mistakes a newcomer makes, and the one line that answers
 * each: a misspelt key gets the nearest key ("did you mean"), a bad enum
 * value the list of valid ones; enum values are read in any case, like
 * booleans; blanks after a colon count the same for every key; report_path
 * refuses % escapes other than %p, %r, %%; a home_device this process has
 * no device for is refused at run time (at initialisation: test_backends.c);
 * and the
 * printed configuration is what was configured (home_device:auto, sizes
 * with units) and reads back to the same text.
 *
 * This process runs with backend:host,host_devices:2. */
#include "testutil.h"

#include "core/internal.h"

#include <sys/wait.h>
#include <unistd.h>

/* configure(conf) fails with -TALLY_ECONF, writes exactly one line to the
 * sink, and that line is "tally: " + expected. */
static void refused(const char *conf, const char *expected)
{
    char *before = tu_options_text();
    cap_begin();
    int rc = tally_configure(conf);
    cap_end();
    tu_ctx("tally_configure(\"%s\")", conf);
    EQ(rc, -TALLY_ECONF);
    EQ(cap_lines(), 1);
    char line[600];
    snprintf(line, sizeof line, "tally: %s\n", expected);
    if (strcmp(cap_text(), line) != 0)
        fail_msg("tally_configure(\"%s\") wrote\n  %s  expected\n  %s", conf, cap_text(), line);
    char *after = tu_options_text();
    assert_string_equal(before, after); /* nothing changed */
    free(before);
    free(after);
    tu_ctx("%s", "");
}

/* docs/configuration.md: the calls that leave tally uninitialised, so that
 * a key that is not runtime (host_devices) can still be set after them; and
 * one that does initialise (a stage), after which it is refused. In a child,
 * before this process initialises tally. */
static void test_what_initialises(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tally_set_sink(tu_capture_write, &tu_cap);
        tu_buf_t b = {0};
        (void)tally_version();
        (void)tally_last_error();
        int ok = tally_configure("leak_report:off") == 0 && tally_write_options(tu_buf_write, &b) == 0 &&
                 tally_tag_push("t") == 0 && tally_tag_pop() == 0 && tally_tag_name(0) != NULL &&
                 tally_stage_name(0) != NULL;
        (void)tally_torch_oom_raises();
        int before = tally_configure("host_devices:3");
        int count = tally_device_count();
        int stage = tally_stage_begin("s");
        int after = tally_configure("host_devices:4");
        _exit(!ok ? 1 : before != 0 ? 2 : count != 3 ? 3 : stage != 0 ? 4 : after != -TALLY_ECONF ? 5 : 0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("step %d of the child failed (1: a call, 2: host_devices refused before initialising, 3: "
                 "device count, 4: stage, 5: host_devices accepted after)",
                 WEXITSTATUS(status));
}

static void test_home_device_beyond_the_devices_refused_at_run_time(void **state)
{
    (void)state;
    EQ(tally_init(), 0);
    refused("home_device:5", "config: home_device: 5 is not a device (2 devices: 0 to 1)");
    refused("home_device:2", "config: home_device: 2 is not a device (2 devices: 0 to 1)");
    /* Past any device tally can drive (64) or below 0: not a device number at all. */
    refused("home_device:63", "config: home_device: 63 is not a device (2 devices: 0 to 1)");
    refused("home_device:64", "config: home_device: '64' is not auto, none or a device number");
    refused("home_device:-1", "config: home_device: '-1' is not auto, none or a device number");
    EQ(tally_configure("home_device:1"), 0);
    char *t = tu_options_text();
    HAS(t, "home_device:1 ");
    free(t);
    EQ(tally_configure("home_device:NONE"), 0);
    EQ(tally_configure("home_device:auto"), 0);
}

static void test_unknown_key_suggests_the_nearest(void **state)
{
    (void)state;
    refused("leak_reprot:full", "config: unknown key 'leak_reprot' (did you mean 'leak_report'?)");
    refused("timline:true", "config: unknown key 'timline' (did you mean 'timeline'?)");
    refused("max_split_size:64", "config: unknown key 'max_split_size' (did you mean 'max_split_size_mb'?)");
    refused("zzz:1", "config: unknown key 'zzz' (tally_write_options lists the keys)");
    /* Two edits from stage_report and from leak_report: a tie goes to the
     * key tally_write_options prints first (the options table's order). */
    refused("stak_report:full", "config: unknown key 'stak_report' (did you mean 'stage_report'?)");
}

/* An item without a colon, or with a value but no key (":x", blanks before
 * the colon), is refused naming the item, and a good item beside it is not
 * applied. */
static void test_item_without_a_key_refused(void **state)
{
    (void)state;
    refused("leak_report", "config: item 'leak_report' is not key:value");
    refused("stage_report:true,timeline", "config: item 'timeline' is not key:value");
    refused(":true", "config: item ':true' has no key");
    refused("  \t: full", "config: item ':full' has no key");
    refused("stage_report:true, :1", "config: item ':1' has no key");
}

/* One typo of each kind gets the key meant: a letter changed, one left
 * out, one doubled, two neighbours swapped; a word near no key gets none. */
static void test_each_kind_of_typo_gets_the_key_meant(void **state)
{
    (void)state;
    refused("backtrace_dapth:8", "config: unknown key 'backtrace_dapth' (did you mean 'backtrace_depth'?)");
    refused("ledgr:on", "config: unknown key 'ledgr' (did you mean 'ledger'?)");
    refused("unwindder:auto", "config: unknown key 'unwindder' (did you mean 'unwinder'?)");
    refused("host_mdoe:virtual", "config: unknown key 'host_mdoe' (did you mean 'host_mode'?)");
    refused("colour:red", "config: unknown key 'colour' (tally_write_options lists the keys)");
}

/* The distance behind "did you mean": one per insertion, deletion,
 * substitution or swap of neighbours, none between equal strings. */
static void test_edit_distance_counts_one_per_edit(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        size_t d;
    } cases[] = {
        {"timeline", "timeline", 0}, {"abc", "abd", 1}, {"abc", "ab", 1},   {"ab", "abc", 1},
        {"abcd", "abdc", 1},         {"abc", "xyz", 3}, {"", "abc", 3},     {"kitten", "sitting", 3},
        {"leak_reprot", "leak_report", 1},              {"ledgr", "ledger", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_ctx("edit distance from \"%s\" to \"%s\"", cases[i].a, cases[i].b);
        EQ(tally__edit_distance(cases[i].a, cases[i].b), cases[i].d);
        EQ(tally__edit_distance(cases[i].b, cases[i].a), cases[i].d);
    }
    tu_ctx("%s", "");
}

static void test_unknown_enum_value_lists_the_valid_ones(void **state)
{
    (void)state;
    refused("leak_report:ful", "config: leak_report: unknown value 'ful' (valid: off, summary, full)");
    tally_options_t o;
    tally__options_default(&o);
    cap_begin();
    EQ(tally__options_parse(&o, "backend:gpu", false, NULL), -TALLY_ECONF);
    EQ(tally__options_parse(&o, "host_mode:real", false, NULL), -TALLY_ECONF);
    cap_end();
    HAS(cap_text(), "config: backend: unknown value 'gpu' (valid: auto, host, cuda, async; PyTorch's native, "
                    "cudaMallocAsync)\n");
    HAS(cap_text(), "config: host_mode: unknown value 'real' (valid: backed, virtual)\n");
}

/* Enum values in any case, as booleans always were. */
static void test_enum_values_in_any_case(void **state)
{
    (void)state;
    EQ(tally_configure("leak_report:FULL"), 0);
    char *t = tu_options_text();
    HAS(t, "leak_report:full ");
    free(t);
    EQ(tally_configure("leak_report:Off,stage_report:TRUE"), 0);
    tally_options_t o;
    tally__options_default(&o);
    EQ(tally__options_parse(&o, "backend:HOST,host_mode:Virtual,async_pool:PRIVATE,backend:CudaMallocAsync",
                            false, NULL),
       0);
    EQ(o.backend, TALLY_BACKEND_ASYNC);
    EQ(o.host_mode, TALLY_HOST_VIRTUAL);
    EQ(o.async_private_pool, 1);
}

/* Every key read with blanks around its value (and its key) is the same as
 * without: the printed configuration, each item given both ways. */
static void test_blanks_after_a_colon_count_the_same_for_every_key(void **state)
{
    (void)state;
    char *text = tu_options_text();
    int keys = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *hash = strstr(line, "    #");
        if (hash)
            *hash = 0;
        char *colon = strchr(line, ':');
        assert_non_null(colon);
        *colon = 0;
        char plain[700], blanks[720];
        snprintf(plain, sizeof plain, "%s:%s", line, colon + 1);
        snprintf(blanks, sizeof blanks, " %s \t: %s ", line, colon + 1);
        tally_options_t a, b;
        tally__options_default(&a);
        tally__options_default(&b);
        tu_ctx("%.100s", blanks);
        EQ(tally__options_parse(&a, plain, false, NULL), 0);
        EQ(tally__options_parse(&b, blanks, false, NULL), 0);
        if (memcmp(&a, &b, sizeof a) != 0)
            fail_msg("'%s' and '%s' configure different things", plain, blanks);
        keys++;
    }
    tu_ctx("%s", "");
    assert_true(keys >= 20);
    free(text);
}

static void test_report_path_refuses_unknown_escapes(void **state)
{
    (void)state;
    refused("report_path:/tmp/run-%d.json",
            "config: report_path: unknown escape '%d' in '/tmp/run-%d.json' (valid: %p pid, %r rank, %% a %)");
    refused("report_path:/tmp/run%", "config: report_path: unknown escape '%' in '/tmp/run%' (valid: %p pid, %r "
                                     "rank, %% a %)");
    EQ(tally_configure("report_path:/tmp/tally-%p-%r-100%%.json"), 0);
    EQ(tally_configure("report_path:"), 0);
    cap_begin();
    EQ(tally_write_report("/tmp/tally-%Y.json"), -TALLY_EINVAL);
    cap_end();
    assert_string_equal(tally_last_error(), "tally_write_report: unknown escape '%Y' in '/tmp/tally-%Y.json' (valid: "
                                            "%p pid, %r rank, %% a %)");
    EQ(access("/tmp/tally-%Y.json", F_OK), -1);
}

/* A string value must read back from the printed configuration: a control
 * character (a tab, a byte under 0x20 such as 0x1f, DEL is not one) or a
 * bracket in it is refused, whichever string key holds it, and the
 * configuration stays as it was. */
static void test_string_values_refuse_control_characters_and_brackets(void **state)
{
    (void)state;
    refused("report_path:/tmp/a\tb.json",
            "config: report_path: value may not contain control characters or brackets");
    refused("report_path:/tmp/a\x1f.json",
            "config: report_path: value may not contain control characters or brackets");
    refused("leak_suppressions:a[0]", "config: leak_suppressions: value may not contain control characters or "
                                      "brackets");
    refused("persistent_tags:x]", "config: persistent_tags: value may not contain control characters or brackets");
    /* "    #" starts the help text of a printed line (tally_write_options),
     * so a value holding it would read back cut short; three blanks, or
     * four before another character, read back whole. */
    refused("persistent_tags:kv    #cache", "config: persistent_tags: value may not contain four blanks before '#' (the "
                                            "printed configuration's help mark)");
    refused("report_path:/tmp/a    #.json", "config: report_path: value may not contain four blanks before '#' (the "
                                            "printed configuration's help mark)");
    EQ(tally_configure("persistent_tags:a   #b|c    x#"), 0);
    EQ(tally_configure("report_path:/tmp/tally-\x7f-ok.json"), 0);
    EQ(tally_configure("report_path:"), 0);
}

/* What tally_write_options prints is what was configured, in the units a
 * person writes, and reading it back prints the same text. */
static void test_printed_configuration_is_what_was_configured(void **state)
{
    (void)state;
    EQ(tally_init(), 0);
    char *text = tu_options_text();
    HAS(text, "home_device:auto "); /* not what auto resolved to */
    HAS(text, "host_capacity:80GiB ");
    HAS(text, "async_release_threshold:all ");
    tally_options_t o;
    tally__options_default(&o);
    char conf[4096] = "";
    char *copy = strdup(text);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
        char *hash = strstr(line, "    #");
        if (hash)
            *hash = 0;
        strcat(conf, *conf ? "," : "");
        strcat(conf, line);
    }
    free(copy);
    EQ(tally__options_parse(&o, conf, false, NULL), 0);
    tu_buf_t again = {0};
    tally_out_t *out = calloc(1, sizeof *out);
    assert_non_null(out);
    tally__out_init(out, tu_buf_write, &again);
    EQ(tally__options_write(&o, out), 0);
    free(out);
    assert_string_equal(again.p, text);
    tu_buf_free(&again);
    free(text);
}

/* A split size below 20 MiB is refused with its bounds; only
 * max_split_size_mb adds that "none" is taken too (max_non_split_rounding_mb
 * has no such value). */
static void test_split_size_refusal_offers_none_only_for_max_split_size(void **state)
{
    (void)state;
    tally_options_t o;
    tally__options_default(&o);
    EQ(tally__options_parse(&o, "max_split_size_mb:19", false, NULL), -TALLY_ECONF);
    assert_string_equal(tally_last_error(), "config: max_split_size_mb: '19' must be an integer >= 20 (MiB), or none");
    EQ(tally__options_parse(&o, "max_non_split_rounding_mb:19", false, NULL), -TALLY_ECONF);
    assert_string_equal(tally_last_error(), "config: max_non_split_rounding_mb: '19' must be an integer >= 20 (MiB)");
    EQ(tally__options_parse(&o, "max_non_split_rounding_mb:none", false, NULL), -TALLY_ECONF);
    assert_string_equal(tally_last_error(),
                        "config: max_non_split_rounding_mb: 'none' must be an integer >= 20 (MiB)");
}

/* A configuration of exactly 4096 characters is read to its last item (4096
 * blanks and commas before it, padding the string to the limit), one of 4097
 * is refused and changes nothing. */
static void test_configuration_of_4096_characters_read_4097_refused(void **state)
{
    (void)state;
    static const char item[] = "max_split_size_mb:64";
    static char conf[4098];
    size_t pad = 4096 - (sizeof item - 1);
    for (size_t i = 0; i < pad; i++)
        conf[i] = i % 2 ? ' ' : ',';
    memcpy(conf + pad, item, sizeof item);
    assert_int_equal(strlen(conf), 4096);
    tally_options_t o;
    tally__options_default(&o);
    EQ(tally__options_parse(&o, conf, false, NULL), 0);
    EQ(o.max_split_size, 64ull << 20);
    memmove(conf + 1, conf, 4097);
    conf[0] = ' ';
    assert_int_equal(strlen(conf), 4097);
    tally_options_t again;
    tally__options_default(&again);
    EQ(tally__options_parse(&again, conf, false, NULL), -TALLY_ECONF);
    EQ(again.max_split_size, UINT64_MAX);
}

/* Sizes print in the largest binary unit that divides them, up to TiB: a
 * PiB prints as 1024TiB (there is no larger unit to write), and a size no
 * unit divides prints in bytes. */
static void test_printed_sizes_stop_at_tib(void **state)
{
    (void)state;
    static const struct {
        const char *conf, *printed;
    } cases[] = {
        {"async_release_threshold:1125899906842624", "async_release_threshold:1024TiB "},
        {"async_release_threshold:3377699720527872", "async_release_threshold:3072TiB "},
        {"async_release_threshold:1099511627776", "async_release_threshold:1TiB "},
        {"async_release_threshold:1025", "async_release_threshold:1025 "},
        {"async_release_threshold:3072", "async_release_threshold:3KiB "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tally_options_t o;
        tally__options_default(&o);
        EQ(tally__options_parse(&o, cases[i].conf, false, NULL), 0);
        tu_buf_t text = {0};
        tally_out_t *out = calloc(1, sizeof *out);
        assert_non_null(out);
        tally__out_init(out, tu_buf_write, &text);
        EQ(tally__options_write(&o, out), 0);
        free(out);
        if (!strstr(text.p, cases[i].printed))
            fail_msg("%s printed\n%s\nwithout '%s'", cases[i].conf, text.p, cases[i].printed);
        tu_buf_free(&text);
    }
}

/* Variables of every name length around the 64-byte buffers the hints copy
 * names into: 62 and 63 characters are read (an underscore, capitals: a
 * candidate), 64 and longer are passed over; none is a key, so no line is
 * written, and nothing is written past the buffers (make asan checks the
 * copy of a 64-character name would overrun them). */
static void test_env_hints_take_names_up_to_63_characters(void **state)
{
    (void)state;
    char name[80];
    for (size_t len = 62; len <= 66; len++) {
        memset(name, 'Q', len);
        name[0] = 'X';
        name[1] = '_';
        name[len] = 0;
        assert_int_equal(setenv(name, "full", 1), 0);
        name[1] = 'A'; /* the same length with TALLY_ in front */
        memcpy(name, "TALLY_", 6);
        assert_int_equal(setenv(name, "full", 1), 0);
    }
    cap_begin();
    tally__env_hints();
    cap_end();
    for (size_t len = 62; len <= 66; len++) {
        memset(name, 'Q', len);
        name[0] = 'X';
        name[1] = '_';
        name[len] = 0;
        unsetenv(name);
        memcpy(name, "TALLY_", 6);
        unsetenv(name);
    }
    EQ(cap_lines(), 0);
}

int main(void)
{
    tu_conf("backend:host,host_devices:2,leak_report:off,stage_report:false");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_what_initialises), /* first: forks before this process initialises */
        cmocka_unit_test(test_home_device_beyond_the_devices_refused_at_run_time),
        cmocka_unit_test(test_unknown_key_suggests_the_nearest),
        cmocka_unit_test(test_item_without_a_key_refused),
        cmocka_unit_test(test_each_kind_of_typo_gets_the_key_meant),
        cmocka_unit_test(test_edit_distance_counts_one_per_edit),
        cmocka_unit_test(test_unknown_enum_value_lists_the_valid_ones),
        cmocka_unit_test(test_enum_values_in_any_case),
        cmocka_unit_test(test_blanks_after_a_colon_count_the_same_for_every_key),
        cmocka_unit_test(test_report_path_refuses_unknown_escapes),
        cmocka_unit_test(test_string_values_refuse_control_characters_and_brackets),
        cmocka_unit_test(test_printed_configuration_is_what_was_configured),
        cmocka_unit_test(test_printed_sizes_stop_at_tib),
        cmocka_unit_test(test_env_hints_take_names_up_to_63_characters),
        cmocka_unit_test(test_configuration_of_4096_characters_read_4097_refused),
        cmocka_unit_test(test_split_size_refusal_offers_none_only_for_max_split_size),
    };
    return cmocka_run_group_tests_name("config errors", tests, NULL, NULL);
}
