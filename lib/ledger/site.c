/* Allocation sites. tally_malloc captures the caller's site before it takes
 * any tally lock: its Python frames (pystack.c, already interned) and its
 * native return addresses (unwind.c). The pair is interned here, so a block
 * carries one pointer and a loop that allocates from one place makes one
 * record. Frames are named only when a report is written (symbolize.c).
 * Records are never freed: a site stays valid for the life of the process. */
#include "ledger/site.h"
#include "ledger/stage.h"

#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SITE_BUCKETS 4096
static tally_mutex_t site_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__site_lock(void) { return &site_lock; }
static tally_site_t *site_buckets[SITE_BUCKETS];
static uint32_t site_count;

/* Executable code of libtally.so, [text_lo, text_hi); empty when tally is
 * linked into the program itself (then only the frames up to tally_malloc
 * are tally's). */
static uintptr_t text_lo, text_hi;
static pthread_once_t text_once = PTHREAD_ONCE_INIT;

static int find_text(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t me = (uintptr_t)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || me < lo || me >= lo + ph->p_memsz)
            continue;
        if (info->dlpi_name && info->dlpi_name[0]) { /* a shared library, not the program */
            text_lo = lo;
            text_hi = lo + ph->p_memsz;
        }
        return 1;
    }
    return 0;
}

static void text_init(void)
{
    dl_iterate_phdr(find_text, (void *)(uintptr_t)&tally__site_capture);
}

/* The first frame to keep: after the return into the entry point that
 * captures (hook: tally_malloc, or tally_torch_alloc, PyTorch's entry point,
 * which runs tally_malloc's body inline; normally frame 0, later when a
 * sanitizer's interceptor adds frames), and after any further frames in
 * libtally.so. */
static int first_outside(void *const *frames, int n, void *hook)
{
    int first = n > 1 ? 1 : 0;
    for (int i = 0; i < n && i < 8; i++) {
        if (frames[i] == hook) {
            first = i + 1;
            break;
        }
    }
    pthread_once(&text_once, text_init);
    while (first < n - 1 && (uintptr_t)frames[first] >= text_lo && (uintptr_t)frames[first] < text_hi)
        first++;
    return first;
}

__attribute__((noinline)) tally_site_t *tally__site_capture(int depth, int pydepth)
{
    enum { SLACK = 5 };
    void *frames[64 + SLACK];
    const tally_pysite_t *py = tally__py_capture(pydepth); /* NULL at python_stack:0 */
    int keep = 0, first = 0;
    if (depth > 0) {
        int want = depth + SLACK;
        if (want > (int)(sizeof frames / sizeof frames[0]))
            want = (int)(sizeof frames / sizeof frames[0]);
        int n = tally__unwind(frames, want);
        first = first_outside(frames, n, __builtin_return_address(0));
        keep = n - first < depth ? n - first : depth;
    }
    if (!keep && !py)
        return NULL;
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)py;
    for (int i = 0; i < keep; i++)
        h = (h ^ (uint64_t)(uintptr_t)frames[first + i]) * 1099511628211ull;
    tally__mutex_lock(&site_lock);
    tally_site_t **slot = &site_buckets[h % SITE_BUCKETS];
    for (tally_site_t *s = *slot; s; s = s->next) {
        if (s->hash == h && s->depth == keep && s->py == py &&
            memcmp(s->frames, frames + first, (size_t)keep * sizeof(void *)) == 0) {
            tally__mutex_unlock(&site_lock);
            return s;
        }
    }
    tally_site_t *s = tally__meta_alloc(sizeof *s + (size_t)keep * sizeof(void *));
    if (s) {
        s->hash = h;
        s->depth = keep;
        s->py = py;
        s->id = ++site_count;
        memcpy(s->frames, frames + first, (size_t)keep * sizeof(void *));
        s->next = *slot;
        *slot = s;
    }
    tally__mutex_unlock(&site_lock);
    return s;
}

uint32_t tally__site_id(const tally_site_t *site)
{
    return site ? site->id : 0;
}

static int py_depth(const tally_site_t *site)
{
    return site->py ? site->py->depth : 0;
}

/* One frame of a site as the reports see it: Python frames first, then
 * the native ones, each native return address giving one frame per
 * function inlined there. */
typedef struct frame_view {
    const char *func, *file; /* file: the module for a native frame without line information */
    int line;
    const tally_frame_sym_t *sym; /* NULL for a Python frame */
} frame_view_t;

/* Visit the frames of site until fn returns true; returns whether it did. */
static bool each_frame(const tally_site_t *site, bool (*fn)(const frame_view_t *v, void *arg), void *arg)
{
    if (!site)
        return false;
    for (int i = 0; i < py_depth(site); i++) {
        const tally_pyframe_t *p = &site->py->frames[i];
        frame_view_t v = {p->func, p->file, p->line, NULL};
        if (fn(&v, arg))
            return true;
    }
    tally_frame_sym_t f[TALLY_INLINE_MAX];
    for (int i = 0; i < site->depth; i++) {
        int n = tally__symbolize((uintptr_t)site->frames[i], f, TALLY_INLINE_MAX);
        for (int j = 0; j < n; j++) {
            frame_view_t v = {f[j].func[0] ? f[j].func : "??", f[j].line > 0 ? f[j].file : f[j].module, f[j].line,
                              &f[j]};
            if (fn(&v, arg))
                return true;
        }
    }
    return false;
}

static void view_format(const frame_view_t *v, char *buf, size_t len)
{
    if (v->sym)
        tally__frame_format(v->sym, buf, len);
    else
        snprintf(buf, len, "in %s %s:%d (python)", v->func, v->file, v->line);
}

typedef struct write_ctx {
    tally_out_t *o;
    const char *indent;
    int k;
} write_ctx_t;

static bool write_one(const frame_view_t *v, void *arg)
{
    write_ctx_t *c = arg;
    char line[1400];
    view_format(v, line, sizeof line);
    tally__out_printf(c->o, "%s#%d %s\n", c->indent, c->k++, line);
    return false;
}

void tally__site_write(const tally_site_t *site, tally_out_t *o, const char *indent)
{
    write_ctx_t c = {o, indent, 0};
    each_frame(site, write_one, &c);
}

typedef struct label_ctx {
    char *buf;
    size_t len;
} label_ctx_t;

static bool label_one(const frame_view_t *v, void *arg)
{
    label_ctx_t *c = arg;
    if (v->line > 0)
        snprintf(c->buf, c->len, "%s %s:%d", v->func, v->file, v->line);
    else
        view_format(v, c->buf, c->len);
    return true;
}

void tally__site_label(const tally_site_t *site, char *buf, size_t len)
{
    label_ctx_t c = {buf, len};
    if (!each_frame(site, label_one, &c))
        snprintf(buf, len, "-");
}

typedef struct json_ctx {
    tally_out_t *o;
    bool first;
} json_ctx_t;

static bool json_one(const frame_view_t *v, void *arg)
{
    json_ctx_t *c = arg;
    tally_out_t *o = c->o;
    tally__out_puts(o, c->first ? "{\"name\":" : ",{\"name\":");
    c->first = false;
    tally__out_json_str(o, v->func);
    tally__out_puts(o, ",\"filename\":");
    tally__out_json_str(o, v->file);
    tally__out_printf(o, ",\"line\":%d,\"python\":%s", v->line, v->sym ? "false" : "true");
    if (v->sym)
        tally__out_printf(o, ",\"pc\":%llu", (unsigned long long)v->sym->pc);
    tally__out_puts(o, "}");
    return false;
}

void tally__site_json(const tally_site_t *site, tally_out_t *o)
{
    json_ctx_t c = {o, true};
    tally__out_puts(o, "[");
    each_frame(site, json_one, &c);
    tally__out_puts(o, "]");
}

typedef struct match_ctx {
    bool (*fn)(const char *func, const char *file, void *arg);
    void *arg;
} match_ctx_t;

static bool match_one(const frame_view_t *v, void *arg)
{
    match_ctx_t *c = arg;
    return c->fn(v->func, v->file, c->arg);
}

bool tally__site_any_frame(const tally_site_t *site, bool (*fn)(const char *func, const char *file, void *arg),
                           void *arg)
{
    match_ctx_t c = {fn, arg};
    return each_frame(site, match_one, &c);
}

/* ---- reports grouped by site --------------------------------------------- */

static int by_site(const void *x, const void *y)
{
    uint32_t a = tally__site_id(((const tally_site_row_t *)x)->site);
    uint32_t b = tally__site_id(((const tally_site_row_t *)y)->site);
    return a < b ? -1 : a > b;
}

static int by_site_bytes(const void *x, const void *y)
{
    const tally_site_row_t *a = x, *b = y;
    if (a->site_bytes != b->site_bytes)
        return a->site_bytes < b->site_bytes ? 1 : -1;
    if (a->site != b->site)
        return by_site(x, y);
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? 1 : -1;
    return 0;
}

void tally__write_by_site(tally_out_t *o, tally_site_row_t *rows, size_t n, const char *what,
                          void (*line)(tally_out_t *o, const void *item, void *arg), void *arg)
{
    if (!n)
        return;
    qsort(rows, n, sizeof *rows, by_site);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint64_t bytes = 0, blocks = 0;
        for (; j < n && rows[j].site == rows[i].site; j++) {
            bytes += rows[j].bytes;
            blocks += rows[j].blocks;
        }
        for (; i < j; i++) {
            rows[i].site_bytes = bytes;
            rows[i].site_blocks = blocks;
        }
    }
    qsort(rows, n, sizeof *rows, by_site_bytes);
    for (size_t i = 0; i < n; i++) {
        const tally_site_row_t *r = &rows[i];
        if (r->site && (i == 0 || rows[i - 1].site != r->site)) {
            char h[32];
            tally__fmt_bytes(r->site_bytes, h, sizeof h);
            tally__out_printf(o, "tally: %s%llu bytes (%s) in %llu block%s allocated from:\n", what,
                              (unsigned long long)r->site_bytes, h, (unsigned long long)r->site_blocks,
                              r->site_blocks == 1 ? "" : "s");
            tally__site_write(r->site, o, "tally:     ");
        }
        line(o, r->item, arg);
    }
}
