/* Host-side metadata memory: every byte of bookkeeping tally holds (block
 * records, pointer maps, interned names, report buffers) comes from here,
 * never from the process's malloc and never from device memory.
 *
 * When jemalloc is already in the process (linked or preloaded), metadata
 * lives in a private jemalloc arena (mallocx / dallocx with MALLOCX_ARENA and
 * no thread cache). Debian's libjemalloc uses initial-exec TLS, so it cannot
 * be dlopen'ed into a running process (Python's ctypes fails with "cannot
 * allocate memory in static TLS block"); libtally.so therefore does not link
 * it, and otherwise uses its own small heap: power-of-two size classes carved
 * from mmap'ed chunks, large requests mapped directly. docs/architecture.md
 * explains the choice. Hot paths do not call this: block records come from
 * per-device free lists refilled in bulk. */
#include "core/internal.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

/* Under AddressSanitizer (make asan) the tally-heap tells ASan which of its
 * bytes are in use, as mimalloc's and sqlite's heaps do: a chunk starts
 * poisoned, an object's payload is unpoisoned when it is handed out and
 * poisoned again when it is freed, and the 16-byte headers and the slack up
 * to the size class stay poisoned. So a read or write past the end of a
 * metadata array (one page too many in a loop over a segment's pages) is
 * reported, which ASan could not see inside the heap's own chunks. */
#if defined(__SANITIZE_ADDRESS__)
#define META_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define META_ASAN 1
#endif
#endif
#ifdef META_ASAN
#include <sanitizer/asan_interface.h>
#define META_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define META_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define META_POISON(p, n) ((void)(p), (void)(n))
#define META_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* jemalloc's mallocx flag encoding (stable ABI since jemalloc 3), defined
 * here so the build needs no jemalloc headers: jemalloc is only ever found
 * at run time. */
#define TALLY_MALLOCX_ARENA(a) ((((int)(a)) + 1) << 20)
#define TALLY_MALLOCX_TCACHE_NONE ((int)((-1 + 2) << 8))

typedef void *(*mallocx_fn)(size_t, int);
typedef void (*dallocx_fn)(void *, int);
typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static pthread_once_t meta_once = PTHREAD_ONCE_INIT;
static mallocx_fn je_alloc;
static dallocx_fn je_free;
static int je_flags;
static _Atomic size_t meta_bytes;

/* Own heap: classes 32 B .. 64 KiB; header of 16 bytes before each object. */
#define META_MIN_SHIFT 5
#define META_CLASSES 12 /* 32 << 11 = 64 KiB */
#define META_CHUNK (1u << 20)
typedef struct meta_free {
    struct meta_free *next;
} meta_free_t;
typedef struct meta_hdr {
    uint64_t size;  /* total bytes including header */
    uint32_t klass; /* class index, or META_CLASSES for a direct mapping */
    uint32_t pad;   /* never read or written: keeps the payload 16-byte aligned */
} meta_hdr_t;
_Static_assert(sizeof(meta_hdr_t) % 16 == 0, "metadata payloads must stay 16-byte aligned");

static tally_mutex_t heap_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__heap_lock(void) { return &heap_lock; }
static meta_free_t *heap_free[META_CLASSES];
static char *chunk_cur, *chunk_end;

static void meta_setup(void)
{
    mallocx_fn a = (mallocx_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "mallocx");
    dallocx_fn f = (dallocx_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "dallocx");
    mallctl_fn ctl = (mallctl_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "mallctl");
    if (!a || !f || !ctl)
        return;
    unsigned arena;
    size_t sz = sizeof arena;
    if (ctl("arenas.create", &arena, &sz, NULL, 0) != 0)
        return;
    je_flags = TALLY_MALLOCX_ARENA(arena) | TALLY_MALLOCX_TCACHE_NONE;
    je_alloc = a;
    je_free = f;
}

const char *tally__meta_source(void)
{
    pthread_once(&meta_once, meta_setup);
    return je_alloc ? "jemalloc" : "tally-heap";
}

/* Fault injection for the tests, as sqlite's test builds fail the Nth
 * malloc: with fail_nth set, the allocation of that rank from the arming
 * fails, and then every fail_every-th one after it when fail_every != 0.
 * It fails at one of two places (fail_in_heap): at the entry of
 * tally__meta_alloc, or inside the tally-heap as the kernel refusing its
 * mapping, so the heap's own failure path (its lock held) runs too.
 * One relaxed load when off; metadata allocation is never on a hot path. */
static _Atomic uint64_t fail_nth, fail_every, fail_seen, fail_hits;
static _Atomic bool fail_in_heap;

void tally__meta_fail_in_heap(bool in_heap)
{
    atomic_store(&fail_in_heap, in_heap);
}

void tally__meta_fail(uint64_t nth, uint64_t every)
{
    atomic_store(&fail_nth, 0);
    atomic_store(&fail_seen, 0);
    atomic_store(&fail_hits, 0);
    atomic_store(&fail_every, every);
    atomic_store(&fail_nth, nth);
}

uint64_t tally__meta_fail_hits(void)
{
    return atomic_load(&fail_hits);
}

static bool injected_failure(void)
{
    uint64_t nth = atomic_load_explicit(&fail_nth, memory_order_relaxed);
    if (!nth)
        return false;
    uint64_t c = atomic_fetch_add(&fail_seen, 1) + 1;
    uint64_t every = atomic_load(&fail_every);
    if (c < nth || (c > nth && (!every || (c - nth) % every != 0)))
        return false;
    atomic_fetch_add(&fail_hits, 1);
    return true;
}

static bool refused_by_the_kernel(void)
{
    return atomic_load_explicit(&fail_in_heap, memory_order_relaxed) && injected_failure();
}

static void *heap_alloc(size_t size)
{
    size_t need = size + sizeof(meta_hdr_t);
    if (need < size)
        return NULL;
    if (need > ((size_t)1 << (META_MIN_SHIFT + META_CLASSES - 1))) {
        size_t len = (need + 4095) & ~(size_t)4095;
        void *m = refused_by_the_kernel() ? MAP_FAILED
                                          : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        meta_hdr_t *h = m;
        h->size = len;
        h->klass = META_CLASSES;
        atomic_fetch_add(&meta_bytes, len);
        META_POISON(h, len);
        META_UNPOISON(h + 1, size);
        return h + 1;
    }
    uint32_t k = 0;
    while (((size_t)1 << (META_MIN_SHIFT + k)) < need)
        k++;
    size_t csize = (size_t)1 << (META_MIN_SHIFT + k);
    /* An injected refusal stands for a kernel that refuses the next chunk
     * while this class's free list is empty. */
    bool refused = refused_by_the_kernel();
    tally__mutex_lock(&heap_lock);
    meta_hdr_t *h = refused ? NULL : (meta_hdr_t *)heap_free[k];
    if (h) {
        META_UNPOISON(h, sizeof(meta_free_t));
        heap_free[k] = heap_free[k]->next;
    } else {
        if (refused || !chunk_cur || (size_t)(chunk_end - chunk_cur) < csize) {
            /* The tail of the old chunk is left unused: chunks are never
             * returned, and the tail is at most one class size. */
            void *m = refused ? MAP_FAILED
                              : mmap(NULL, META_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) {
                tally__mutex_unlock(&heap_lock);
                return NULL;
            }
            chunk_cur = m;
            chunk_end = chunk_cur + META_CHUNK;
            META_POISON(m, META_CHUNK);
        }
        h = (meta_hdr_t *)chunk_cur;
        chunk_cur += csize;
    }
    tally__mutex_unlock(&heap_lock);
    META_UNPOISON(h, sizeof *h);
    h->size = csize;
    h->klass = k;
    META_POISON(h, csize);
    META_UNPOISON(h + 1, size);
    atomic_fetch_add(&meta_bytes, csize);
    return h + 1;
}

static void heap_free_obj(void *p)
{
    meta_hdr_t *h = (meta_hdr_t *)p - 1;
    META_UNPOISON(h, sizeof *h);
    size_t csize = h->size;
    uint32_t k = h->klass;
    atomic_fetch_sub(&meta_bytes, csize);
    if (k >= META_CLASSES) {
        META_UNPOISON(h, csize); /* the kernel's pages again */
        munmap(h, csize);
        return;
    }
    META_POISON(h, csize);
    tally__mutex_lock(&heap_lock);
    META_UNPOISON(h, sizeof(meta_free_t));
    ((meta_free_t *)h)->next = heap_free[k];
    META_POISON(h, sizeof(meta_free_t));
    heap_free[k] = (meta_free_t *)h;
    tally__mutex_unlock(&heap_lock);
}

void *tally__meta_alloc(size_t size)
{
    pthread_once(&meta_once, meta_setup);
    if (!atomic_load_explicit(&fail_in_heap, memory_order_relaxed) && injected_failure())
        return NULL;
    if (size == 0)
        size = 1;
    if (je_alloc) {
        /* Keep a size header so tally__meta_bytes stays exact. */
        size_t need = size + 16;
        if (need < size)
            return NULL;
        uint64_t *h = je_alloc(need, je_flags);
        if (!h)
            return NULL;
        h[0] = need;
        atomic_fetch_add(&meta_bytes, need);
        return h + 2;
    }
    return heap_alloc(size);
}

void *tally__meta_calloc(size_t size)
{
    void *p = tally__meta_alloc(size);
    if (p)
        memset(p, 0, size);
    return p;
}

void tally__meta_free(void *p)
{
    if (!p)
        return;
    if (je_alloc) {
        uint64_t *h = (uint64_t *)p - 2;
        atomic_fetch_sub(&meta_bytes, h[0]);
        je_free(h, je_flags);
        return;
    }
    heap_free_obj(p);
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

char *tally__meta_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tally__meta_alloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

size_t tally__meta_bytes(void)
{
    return atomic_load(&meta_bytes);
}
