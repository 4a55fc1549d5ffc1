/* Fuzz target: the tally command's readers (tools/), on a JSON document of
 * arbitrary bytes: `tally summary` (with and without --device and
 * --abbreviated), `tally ledger`, `tally merge` (text and --json; the file
 * given twice, which is a duplicate rank) and `tally plot` (SVG and HTML).
 * The command is compiled in from tools/tally_cli.c with its main renamed;
 * the input is written to a temporary file and each command runs on it.
 *
 * Checked: no crash, no sanitizer report, no leak; every command exits 0
 * (usable input) or 1 (unusable input: malformed JSON, wrong schema, absent
 * device, no timeline), never 2 (the command lines are valid) and never
 * anything else; merging a file with itself is refused (exit 1). */
#define main tally_cli_main
#include "../../tools/tally_cli.c"
#undef main

#include <unistd.h>

static char dir[256], in_path[320], out_svg[320], out_html[320];
static FILE *devnull;

static void remove_dir(void)
{
    unlink(in_path);
    unlink(out_svg);
    unlink(out_html);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *base = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tally-fuzz-report-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir))
        abort();
    snprintf(in_path, sizeof in_path, "%s/in.json", dir);
    snprintf(out_svg, sizeof out_svg, "%s/out.svg", dir);
    snprintf(out_html, sizeof out_html, "%s/out.html", dir);
    devnull = fopen("/dev/null", "w");
    if (!devnull)
        abort();
    atexit(remove_dir);
    return 0;
}

/* Run the command with stdout and stderr (the FILE streams, not the
 * descriptors: a sanitizer report still reaches the terminal) discarded. */
static int run(int argc, const char **argv)
{
    FILE *out = stdout, *err = stderr;
    stdout = devnull;
    stderr = devnull;
    int rc = tally_cli_main(argc, (char **)argv);
    fflush(devnull);
    stdout = out;
    stderr = err;
    if (rc != 0 && rc != EXIT_DATA) {
        fprintf(stderr, "fuzz_report: exit status %d from", rc);
        for (int i = 0; i < argc; i++)
            fprintf(stderr, " %s", argv[i]);
        fprintf(stderr, "\n");
        abort();
    }
    return rc;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    FILE *f = fopen(in_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    const char *summary[] = {"tally", "summary", in_path};
    const char *summary_dev[] = {"tally", "summary", "--device", "1", "--abbreviated", in_path};
    const char *ledger[] = {"tally", "ledger", in_path};
    const char *merge[] = {"tally", "merge", in_path};
    const char *merge_json[] = {"tally", "merge", "--json", in_path};
    const char *merge_twice[] = {"tally", "merge", in_path, in_path};
    const char *plot_svg[] = {"tally", "plot", in_path, "-o", out_svg};
    const char *plot_html[] = {"tally", "plot", in_path, "--x", "events", "-o", out_html};
    int rc = run(3, summary);
    run(6, summary_dev);
    int rc_ledger = run(3, ledger);
    run(3, merge);
    run(4, merge_json);
    if (run(4, merge_twice) != EXIT_DATA)
        abort(); /* the same rank twice */
    if (rc_ledger == 0) {
        /* A usable report: plotting needs a timeline, which it may lack. */
        run(5, plot_svg);
        run(7, plot_html);
    }
    (void)rc;
    unlink(out_svg);
    unlink(out_html);
    return 0;
}
