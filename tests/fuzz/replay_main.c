/* A main for the fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput
 * once on each file named on the command line (directories: every file in
 * them, in name order), the way a libFuzzer binary does when given files.
 * Used by `make fuzz-replay` (and so by `make test-c`) to replay the seed
 * corpora and the regression inputs with the ordinary compiler and the
 * sanitizer of the build. Prints "replayed N inputs" and exits 0, or dies
 * where the target aborts. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static long replayed;

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (n == cap)
            buf = realloc(buf, cap *= 2);
        if (!buf)
            abort();
        size_t got = fread(buf + n, 1, cap - n, f);
        if (!got)
            break;
        n += got;
    }
    fclose(f);
    /* A copy of exactly n bytes, so a read past the end is caught. */
    unsigned char *exact = malloc(n ? n : 1);
    if (!exact)
        abort();
    memcpy(exact, buf, n);
    free(buf);
    if (getenv("REPLAY_VERBOSE"))
        fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    replayed++;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static void run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return; /* a target without regressions has no directory */
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, by_name);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name);
            run_path(sub);
        }
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++)
        run_path(argv[i]);
    printf("replayed %ld inputs\n", replayed);
    return 0;
}
