/* Formatted output through a caller's write callback, and the diagnostics
 * channel: the thread-local last-error message and the process-wide sink.
 * Nothing else in the library writes text anywhere. */
#include "core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void tally__out_init(tally_out_t *o, tally_write_fn write, void *arg)
{
    o->write = write;
    o->arg = arg;
    o->len = 0;
    o->failed = 0;
}

void tally__out_flush(tally_out_t *o)
{
    if (o->len && o->write)
        o->write(o->arg, o->buf, o->len);
    o->len = 0;
}

void tally__out_write(tally_out_t *o, const char *text, size_t len)
{
    if (len >= sizeof o->buf - o->len) {
        tally__out_flush(o);
        if (len >= sizeof o->buf) {
            if (o->write)
                o->write(o->arg, text, len);
            return;
        }
    }
    memcpy(o->buf + o->len, text, len);
    o->len += len;
}

void tally__out_puts(tally_out_t *o, const char *text)
{
    tally__out_write(o, text, strlen(text));
}

void tally__out_printf(tally_out_t *o, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        tally__out_write(o, tmp, (size_t)n);
        return;
    }
    /* Rare long line: format again into a buffer of the right size. */
    char *big = tally__meta_alloc((size_t)n + 1);
    if (!big) {
        o->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    tally__out_write(o, big, (size_t)n);
    tally__meta_free(big);
}

/* JSON string literal with escapes. */
void tally__out_json_str(tally_out_t *o, const char *s)
{
    tally__out_write(o, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            tally__out_write(o, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            tally__out_write(o, esc, 6);
        } else {
            tally__out_write(o, (const char *)p, 1);
        }
    }
    tally__out_write(o, "\"", 1);
}

/* Writes to a FILE* (used for the default sink and for report files). */
void tally__write_file(void *arg, const char *text, size_t len)
{
    fwrite(text, 1, len, (FILE *)arg);
}

/* 64 bits nobody else can guess: the kernel's random bytes, else a mix of
 * the clock, the pid and a counter. */
static uint64_t unpredictable(void)
{
    static _Atomic uint64_t counter;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)ts.tv_sec << 20 ^ (uint64_t)getpid() << 40;
    return r ^ (++counter * 0xbf58476d1ce4e5b9u);
}

/* A new file beside dest, for writing it whole then renaming it over dest:
 * "DEST.tmp-" and 16 random hex digits, created exclusively and without
 * following a symlink (O_CREAT|O_EXCL|O_NOFOLLOW), so a name planted in a
 * shared directory (a link to someone's file) is never written through.
 * The name is left in tmp. NULL with errno set when it cannot be created. */
FILE *tally__create_beside(const char *dest, char *tmp, size_t tmplen)
{
    for (int attempt = 0; attempt < 64; attempt++) {
        int n = snprintf(tmp, tmplen, "%s.tmp-%016llx", dest, (unsigned long long)unpredictable());
        if (n < 0 || (size_t)n >= tmplen) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0) {
            if (errno == EEXIST)
                continue;
            return NULL;
        }
        FILE *f = fdopen(fd, "w");
        if (!f) {
            int e = errno;
            close(fd);
            unlink(tmp);
            errno = e;
        }
        return f;
    }
    errno = EEXIST;
    return NULL;
}

/* ---- diagnostics -------------------------------------------------------- */

static _Thread_local char last_error[512];

static void stderr_write(void *arg, const char *text, size_t len)
{
    (void)arg;
    /* write(2) directly: usable from exit handlers and after stdio teardown. */
    while (len) {
        ssize_t n = write(2, text, len);
        if (n <= 0)
            return;
        text += n;
        len -= (size_t)n;
    }
}

static tally_write_fn sink_fn = stderr_write;
static void *sink_arg;
static tally_mutex_t sink_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__sink_lock(void) { return &sink_lock; }

void tally_set_sink(tally_write_fn write, void *arg)
{
    tally__mutex_lock(&sink_lock);
    sink_fn = write ? write : stderr_write;
    sink_arg = write ? arg : NULL;
    tally__mutex_unlock(&sink_lock);
}

void tally__sink_write(const char *text, size_t len)
{
    tally__mutex_lock(&sink_lock);
    sink_fn(sink_arg, text, len);
    tally__mutex_unlock(&sink_lock);
}

/* Sink as a tally_write_fn, for reports written to the diagnostics channel. */
void tally__sink_writer(void *arg, const char *text, size_t len)
{
    (void)arg;
    tally__sink_write(text, len);
}

static void vdiag(const char *fmt, va_list ap, char *copy, size_t copy_size)
{
    char line[640];
    int n = snprintf(line, sizeof line, "tally: ");
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    if (copy) {
        size_t c = len - (size_t)n < copy_size - 1 ? len - (size_t)n : copy_size - 1;
        memcpy(copy, line + n, c);
        copy[c] = 0;
    }
    line[len++] = '\n';
    tally__sink_write(line, len);
}

void tally__diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdiag(fmt, ap, NULL, 0);
    va_end(ap);
}

int tally__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vdiag(fmt, ap, last_error, sizeof last_error);
    va_end(ap);
    return -code;
}

int tally__fail_quiet(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -code;
}

void tally__clear_error(void)
{
    last_error[0] = 0;
}

const char *tally_last_error(void)
{
    return last_error;
}

void tally__fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
}

const char *tally__plural(uint64_t n)
{
    return n == 1 ? "" : "s";
}
