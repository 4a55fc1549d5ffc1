/* Metadata memory for the fuzz build: lib/core/meta.c's own heap carves objects
 * out of large mmap'ed chunks, so AddressSanitizer cannot see an overflow
 * from one metadata object into the next. The fuzz targets are linked with
 * this file instead of lib/core/meta.c: every metadata object is its own malloc
 * block, and ASan checks its bounds. Same interface as lib/core/meta.c. */
#include "core/internal.h"

#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static _Atomic size_t meta_bytes;

/* malloc locks for itself (and glibc's fork handling keeps it consistent);
 * the fork handlers (lib/api/fork.c) still take the heap's lock in their order. */
static tally_mutex_t heap_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__heap_lock(void)
{
    return &heap_lock;
}

void *tally__meta_alloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p)
        atomic_fetch_add(&meta_bytes, malloc_usable_size(p));
    return p;
}

void *tally__meta_calloc(size_t size)
{
    void *p = calloc(1, size ? size : 1);
    if (p)
        atomic_fetch_add(&meta_bytes, malloc_usable_size(p));
    return p;
}

void tally__meta_free(void *p)
{
    if (!p)
        return;
    atomic_fetch_sub(&meta_bytes, malloc_usable_size(p));
    free(p);
}

char *tally__meta_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tally__meta_alloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void *tally__meta_grow(void *old, size_t n, size_t cap, size_t elem)
{
    if (n > cap || (elem && cap > SIZE_MAX / elem))
        return NULL;
    void *p = tally__meta_alloc(cap * elem);
    if (!p)
        return NULL;
    if (n)
        memcpy(p, old, n * elem);
    tally__meta_free(old);
    return p;
}

size_t tally__meta_bytes(void)
{
    return atomic_load(&meta_bytes);
}

const char *tally__meta_source(void)
{
    return "malloc (fuzz build)";
}
