/* The symbolizer behind a site's frames: on its own in a fresh process (a
 * library loaded after it started, an address in no module, a page above a
 * library, libdw.so.1 that does not load), each way a frame is written from
 * what it found, and sites captured by many threads while reports
 * symbolise them. (Sites in the leak report, suppressions and
 * tally_ignore: test_ledger_sites.c.)
 *
 * The symbolizer runs in children (this binary re-executed with --child
 * ROLE), so that it starts there from scratch. */
#include "ledgerutil.h"

#include "ledger/site.h" /* tally__symbolize, tally__frame_format */

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define MB LU_MiB
#define BASE "backend:host,host_devices:2,host_mode:virtual,host_capacity:8GiB"

/* ---- the children -------------------------------------------------------------- */

/* The symbolizer on its own, in a fresh process: whether it has file and
 * line information (libdw) is whether libdw.so.1 loads, asked twice (its
 * lock is given back); an address in no module is the bare "0x... in ??";
 * and a library loaded after the symbolizer started is found: its exported
 * function named with the offset into it and the offset into the module,
 * and, with libdw and the stand-in's debug information, its file and line.
 * The stand-in libcuda.so.1 on LD_LIBRARY_PATH is that library. */
static int child_symbolizer(void)
{
    alarm(30); /* a lock never given back: a clean death, not a hang */
    void *dw = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    bool have_dw = dw != NULL;
    LU_REQUIRE(tally__symbolizer_has_dwarf() == have_dw);
    LU_REQUIRE(tally__symbolizer_has_dwarf() == have_dw);
    tally_frame_sym_t f[TALLY_INLINE_MAX];
    char text[1200];
    LU_REQUIRE(tally__symbolize(0x10, f, TALLY_INLINE_MAX) == 1);
    tally__frame_format(&f[0], text, sizeof text);
    LU_REQUIRE(strcmp(text, "0x000000000010 in ??") == 0);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("no libcuda.so.1 on the library path\n");
        return 77;
    }
    void *fn = dlsym(h, "cuInit");
    Dl_info info;
    LU_REQUIRE(fn && dladdr(fn, &info) && info.dli_fname);
    uintptr_t pc = (uintptr_t)fn + 5; /* a return address 5 bytes into cuInit */
    LU_REQUIRE(tally__symbolize(pc, f, TALLY_INLINE_MAX) >= 1);
    tally__frame_format(&f[0], text, sizeof text);
    printf("libdw %s: %s\n", have_dw ? "loaded" : "absent", text);
    LU_REQUIRE(f[0].pc == pc);
    LU_REQUIRE(strcmp(f[0].func, "cuInit") == 0);
    LU_REQUIRE(f[0].line > 0 || f[0].func_offset == 5); /* with a line, the offset is not shown */
    LU_REQUIRE(f[0].module_offset == pc - (uintptr_t)info.dli_fbase);
    LU_REQUIRE(strstr(f[0].module, "libcuda.so.1") != NULL);
    if (have_dw && strstr(info.dli_fname, "/standin/")) {
        LU_REQUIRE(f[0].line > 0 && strstr(f[0].file, "standin/init.c"));
    } else if (!have_dw) {
        char want[200];
        snprintf(want, sizeof want, "0x%012llx in cuInit+0x5 (libcuda.so.1+0x%llx)", (unsigned long long)pc,
                 (unsigned long long)(pc - (uintptr_t)info.dli_fbase));
        LU_REQUIRE(strcmp(text, want) == 0);
    }
    /* A C library function's frame keeps its function but gets no line (with
     * libdw or without): the offset shown is the return address's from the
     * function's start, 5, not the call's (4). */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD); /* its own qsort, not a sanitizer's */
    void *qs = libc ? dlsym(libc, "qsort") : NULL;
    LU_REQUIRE(qs != NULL);
    LU_REQUIRE(tally__symbolize((uintptr_t)qs + 5, f, TALLY_INLINE_MAX) >= 1);
    tally__frame_format(&f[0], text, sizeof text);
    printf("libc: %s\n", text);
    LU_REQUIRE(f[0].func[0] && f[0].line == 0);
    LU_REQUIRE(f[0].func_offset == 5);
    /* An address in the library's own ELF header: in the module, in no
     * function (libdw's symbol lookup finds nothing there): the module and
     * its offset, no function. */
    uintptr_t hdr = (uintptr_t)info.dli_fbase + 64;
    memset(f, 0x5a, sizeof f);
    LU_REQUIRE(tally__symbolize(hdr, f, TALLY_INLINE_MAX) >= 1);
    LU_REQUIRE(f[0].func[0] == 0 && f[0].line == 0);
    tally__frame_format(&f[0], text, sizeof text);
    char want[200];
    snprintf(want, sizeof want, "0x%012llx in ?? (libcuda.so.1+0x40)", (unsigned long long)hdr);
    printf("header: %s\n", text);
    LU_REQUIRE(strcmp(text, want) == 0);
    return 0;
}

/* An address just above a library, in a page mapped after the symbolizer
 * started, is in no module: every gap of /proc/self/maps that follows a
 * file-backed mapping gets an anonymous page at its bottom, and each page's
 * frame must name no module and no function. elfutils 0.188's
 * dwfl_addrmodule answers with the library below the gap (above
 * ld-linux-x86-64.so.2, the highest library, in every run here), which is
 * how a library loaded later into such a gap was once reported as the
 * wrong module, with no file and line. Exit 77 without libdw or a gap. */
static int child_symbolizer_gap(void)
{
    alarm(30);
    if (!tally__symbolizer_has_dwarf()) {
        printf("libdw.so.1 does not load\n");
        return 77;
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    LU_REQUIRE(maps != NULL);
    uintptr_t gap[64];
    char below[64][256];
    int ngap = 0;
    uintptr_t prev_end = 0;
    char prev_name[256] = "", line[768];
    long page = sysconf(_SC_PAGESIZE);
    while (fgets(line, sizeof line, maps) && ngap < 64) {
        unsigned long lo, hi;
        char name[256] = "";
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &lo, &hi, name) < 2)
            continue;
        if (prev_end && lo >= prev_end + 2 * (uintptr_t)page && prev_name[0] == '/') {
            gap[ngap] = prev_end;
            snprintf(below[ngap], sizeof below[ngap], "%s", prev_name);
            ngap++;
        }
        prev_end = hi;
        snprintf(prev_name, sizeof prev_name, "%s", name);
    }
    fclose(maps);
    int tried = 0;
    for (int i = 0; i < ngap; i++) {
        void *p = mmap((void *)gap[i], (size_t)page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                       -1, 0);
        if (p == MAP_FAILED)
            continue;
        if (p != (void *)gap[i]) { /* a kernel before 4.17 takes the flag as a hint */
            munmap(p, (size_t)page);
            continue;
        }
        tally_frame_sym_t f[TALLY_INLINE_MAX];
        LU_REQUIRE(tally__symbolize(gap[i] + 0x101, f, TALLY_INLINE_MAX) == 1);
        char text[1200];
        tally__frame_format(&f[0], text, sizeof text);
        printf("a page above %s: %s\n", below[i], text);
        LU_REQUIRE(f[0].module[0] == 0 && f[0].func[0] == 0 && f[0].line == 0);
        tried++;
    }
    if (!tried) {
        printf("no gap above a library\n");
        return 77;
    }
    return 0;
}

/* ---- the symbolizer on its own ------------------------------------------------- */

static void run_symbolizer(const char *const *env)
{
    LU_CHILD_OK_OR_SKIP("symbolizer", BASE, env, "no libcuda.so.1 (the stand-in) on the library path");
}

static void test_symbolizer_names_a_library_loaded_after_it_started(void **state)
{
    (void)state;
    run_symbolizer(NULL);
}

static void test_symbolizer_puts_a_page_above_a_library_in_no_module(void **state)
{
    (void)state;
    LU_CHILD_OK_OR_SKIP("symbolizer-gap", BASE, NULL, "libdw.so.1 does not load, or no gap above a library");
}

/* libdw.so.1 that does not load (an empty file first on the library path):
 * no file and line, names from the dynamic symbol table (dladdr). */
static void test_symbolizer_without_libdw_names_exported_functions(void **state)
{
    (void)state;
    static char path[700], dir[600];
    snprintf(dir, sizeof dir, "%s/nodw", lu_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/libdw.so.1", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    const char *old = getenv("LD_LIBRARY_PATH");
    static char env_path[2048];
    snprintf(env_path, sizeof env_path, "LD_LIBRARY_PATH=%s%s%s", dir, old ? ":" : "", old ? old : "");
    const char *const env[] = {env_path, NULL};
    run_symbolizer(env);
}

/* Each way a frame is written, from what the symbolizer found: a line gives
 * function, file and line; a function in a module both offsets; a function
 * with no module (a frame a JIT or an interpreter names) the function and
 * its offset, never an empty module; a module alone its offset; nothing,
 * the bare address. */
static void test_frame_text_for_each_thing_known(void **state)
{
    (void)state;
    tally_frame_sym_t f;
    char text[1200];
    memset(&f, 0, sizeof f);
    f.pc = 0x7f0012345678;
    f.func_offset = 0x2a;
    f.module_offset = 0x5678;
    tally__frame_format(&f, text, sizeof text);
    assert_string_equal(text, "0x7f0012345678 in ??");
    snprintf(f.module, sizeof f.module, "/usr/lib/libm.so.6");
    tally__frame_format(&f, text, sizeof text);
    assert_string_equal(text, "0x7f0012345678 in ?? (libm.so.6+0x5678)");
    snprintf(f.func, sizeof f.func, "cos");
    tally__frame_format(&f, text, sizeof text);
    assert_string_equal(text, "0x7f0012345678 in cos+0x2a (libm.so.6+0x5678)");
    f.module[0] = 0;
    tally__frame_format(&f, text, sizeof text);
    assert_string_equal(text, "0x7f0012345678 in cos+0x2a");
    snprintf(f.file, sizeof f.file, "s_cos.c");
    f.line = 12;
    tally__frame_format(&f, text, sizeof text);
    assert_string_equal(text, "0x7f0012345678 in cos s_cos.c:12");
}

/* ---- threads ------------------------------------------------------------------ */

#define THREADS 4
#define PER_THREAD 500

static void *thread_blocks[THREADS][PER_THREAD];

static _Atomic int threads_done;

static void *alloc_thread(void *arg)
{
    void **out = arg;
    for (int i = 0; i < PER_THREAD; i++)
        out[i] = tally_malloc(4096, 0, NULL);
    atomic_fetch_add(&threads_done, 1);
    return NULL;
}

static void count_write(void *arg, const char *text, size_t len)
{
    (void)text;
    *(size_t *)arg += len;
}

static void test_sites_from_many_threads_while_reports_are_written(void **state)
{
    (void)state;
    LU_OK(tally_configure("backtrace_depth:6"));
    void *mine = lu_malloc(MB, 1); /* so that every report has a site to name */
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, alloc_thread, thread_blocks[t]), 0);
    /* Reports symbolise while the threads capture and intern sites. */
    size_t written = 0;
    int reports = 0;
    do {
        LU_OK(tally_write_leaks(1, count_write, &written));
        reports++;
    } while (atomic_load(&threads_done) < THREADS);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    LU_OK(tally_configure("backtrace_depth:0"));
    assert_true(written > (size_t)reports * 100);
    tally_free(mine);
    /* One site for all: the same return addresses in every thread. */
    lu_buf_t buf = {0};
    LU_OK(tally_write_leaks(1, lu_buf_write, &buf));
    char want[128];
    snprintf(want, sizeof want, "tally: Direct leak of %d bytes", THREADS * PER_THREAD * 4096);
    LU_HAS(lu_buf_str(&buf), want);
    LU_EQ(lu_count(lu_buf_str(&buf), " in alloc_thread "), 1);
    lu_buf_free(&buf);
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < PER_THREAD; i++)
            tally_free(thread_blocks[t][i]);
    LU_CHECK_OK();
}

/* ---- main ------------------------------------------------------------------------- */

static const lu_role_t roles[] = {
    {"symbolizer", child_symbolizer},
    {"symbolizer-gap", child_symbolizer_gap},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--child") == 0)
        return lu_child_main(argv[2], roles);
    setenv("TALLY_CONF", BASE ",leak_report:off", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sites_from_many_threads_while_reports_are_written),
        cmocka_unit_test(test_frame_text_for_each_thing_known),
        cmocka_unit_test(test_symbolizer_names_a_library_loaded_after_it_started),
        cmocka_unit_test(test_symbolizer_puts_a_page_above_a_library_in_no_module),
        cmocka_unit_test(test_symbolizer_without_libdw_names_exported_functions),
    };
    int failed = cmocka_run_group_tests_name("sites_symbolizer", tests, NULL, NULL);
    lu_tmpdir_cleanup();
    return failed;
}
