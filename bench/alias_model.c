/* The aliasing model of alias_model.h: pages of address space, 2 MiB
 * handles, and the driver calls a policy that maps idle handles at second
 * addresses would make (counted per call, priced with the stand-in's cost
 * table). */
#include "alias_model.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/standin/cost.h"

#define PAGE ((uint64_t)2 << 20) /* 2 MiB: CUDA's granularity, tally's page */
#define NONE (-1)

typedef struct page {
    uint64_t key; /* page number + 1 (0: an empty slot) */
    int32_t busy; /* live blocks touching it */
    int32_t handle; /* mapped here, or NONE */
    int32_t rec;    /* its busy history in hist */
} page_t;

/* A page's busy spans, [start, end) in ticks (block events), for the static
 * assignment. */
typedef struct history {
    uint64_t first;
    uint64_t *span; /* start, end pairs; an open last span ends at UINT64_MAX */
    size_t n, cap;  /* in uint64_t */
} history_t;

struct alias_model {
    page_t *pages; /* open addressing on the page number */
    size_t cap, used;
    int32_t *user;  /* per handle: the busy page using it (its slot), or NONE */
    uint64_t *since; /* per handle: when it last went idle (pages made busy so far) */
    uint32_t *maps;  /* per handle: pages it is mapped at */
    uint64_t clock, page;
    int policy;
    uint64_t tick;
    history_t *hist;
    size_t nhist, chist;
    uint64_t *idle; /* per handle: a bit set while it is idle */
    size_t nhandles, hcap;
    alias_counts_t c;
};

alias_model_t *alias_model_new(int policy, unsigned pages)
{
    alias_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->cap = 1024;
    m->policy = policy;
    m->page = PAGE * (pages ? pages : 1);
    m->pages = calloc(m->cap, sizeof *m->pages);
    if (!m->pages) {
        free(m);
        return NULL;
    }
    return m;
}

void alias_model_free(alias_model_t *m)
{
    if (!m)
        return;
    free(m->pages);
    for (size_t i = 0; i < m->nhist; i++)
        free(m->hist[i].span);
    free(m->hist);
    free(m->user);
    free(m->since);
    free(m->maps);
    free(m->idle);
    free(m);
}

static size_t slot_of(const alias_model_t *m, uint64_t key)
{
    size_t i = (size_t)(key * 0x9e3779b97f4a7c15ull >> 17) & (m->cap - 1);
    while (m->pages[i].key && m->pages[i].key != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

/* Double the page table. Busy pages' handles name their slots, so each
 * moved page that uses its handle tells the handle its new slot. */
static int grow(alias_model_t *m)
{
    page_t *old = m->pages;
    size_t ocap = m->cap;
    m->cap *= 2;
    m->pages = calloc(m->cap, sizeof *m->pages);
    if (!m->pages) {
        m->pages = old;
        m->cap = ocap;
        return -1;
    }
    for (size_t i = 0; i < ocap; i++) {
        if (!old[i].key)
            continue;
        size_t j = slot_of(m, old[i].key);
        m->pages[j] = old[i];
        if (old[i].handle != NONE && m->user[old[i].handle] == (int32_t)i)
            m->user[old[i].handle] = (int32_t)j;
    }
    free(old);
    return 0;
}

static page_t *page_get(alias_model_t *m, uint64_t number)
{
    if ((m->used + 1) * 2 > m->cap && grow(m))
        return NULL;
    uint64_t key = number + 1;
    size_t i = slot_of(m, key);
    if (!m->pages[i].key) {
        if (m->nhist == m->chist) {
            size_t c = m->chist ? m->chist * 2 : 1024;
            history_t *h = realloc(m->hist, c * sizeof *h);
            if (!h)
                return NULL;
            m->hist = h;
            m->chist = c;
        }
        m->hist[m->nhist] = (history_t){0};
        m->pages[i] = (page_t){.key = key, .busy = 0, .handle = NONE, .rec = (int32_t)m->nhist++};
        m->used++;
    }
    return &m->pages[i];
}

static void set_idle(alias_model_t *m, int32_t h, bool idle)
{
    uint64_t bit = 1ull << (h & 63);
    if (idle)
        m->idle[h >> 6] |= bit;
    else
        m->idle[h >> 6] &= ~bit;
}

static int32_t lowest_idle(const alias_model_t *m)
{
    int32_t best = NONE;
    for (size_t w = 0; w * 64 < m->nhandles; w++) {
        for (uint64_t bits = m->idle[w]; bits; bits &= bits - 1) {
            int32_t h = (int32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
            if (m->policy == ALIAS_LOWEST || m->policy == ALIAS_OWN)
                return h;
            if (best == NONE || (m->policy == ALIAS_LRU && m->since[h] < m->since[best]) ||
                (m->policy == ALIAS_MRU && m->since[h] > m->since[best]) ||
                (m->policy == ALIAS_FEWEST && m->maps[h] < m->maps[best]))
                best = h;
        }
    }
    return best;
}

static int32_t new_handle(alias_model_t *m)
{
    if (m->nhandles == m->hcap) {
        size_t cap = m->hcap ? m->hcap * 2 : 1024;
        int32_t *user = realloc(m->user, cap * sizeof *user);
        if (!user)
            return NONE;
        m->user = user;
        uint64_t *since = realloc(m->since, cap * sizeof *since);
        if (!since)
            return NONE;
        m->since = since;
        uint32_t *maps = realloc(m->maps, cap * sizeof *maps);
        if (!maps)
            return NONE;
        m->maps = maps;
        uint64_t *idle = realloc(m->idle, cap / 64 * sizeof *idle);
        if (!idle)
            return NONE;
        memset(idle + m->hcap / 64, 0, (cap - m->hcap) / 64 * sizeof *idle);
        m->idle = idle;
        m->hcap = cap;
    }
    int32_t h = (int32_t)m->nhandles++;
    m->user[h] = NONE;
    m->since[h] = 0;
    m->maps[h] = 0;
    m->c.create++;
    m->c.handles++;
    return h;
}

/* A busy span of page p starts or ends now. */
static int span_mark(alias_model_t *m, page_t *p)
{
    history_t *h = &m->hist[p->rec];
    if (h->n == h->cap) {
        size_t c = h->cap ? h->cap * 2 : 8;
        uint64_t *n = realloc(h->span, c * sizeof *n);
        if (!n)
            return -1;
        h->span = n;
        h->cap = c;
    }
    if (h->n == 0)
        h->first = m->tick;
    h->span[h->n++] = m->tick;
    return 0;
}

/* Page p (at slot s) became busy: give it a handle to use. */
static int page_busy(alias_model_t *m, page_t *p, size_t s)
{
    if (span_mark(m, p))
        return -1;
    if (p->handle != NONE && m->user[p->handle] == NONE) {
        m->user[p->handle] = (int32_t)s; /* its own mapping, idle: no call */
        set_idle(m, p->handle, false);
        return 0;
    }
    bool conflict = p->handle != NONE;
    if (p->handle != NONE) { /* its handle serves another page: unmap here */
        m->c.sync++;
        m->c.unmap++;
        m->maps[p->handle]--;
        p->handle = NONE;
    }
    int32_t h = conflict && m->policy == ALIAS_OWN ? NONE : lowest_idle(m);
    if (h == NONE && (h = new_handle(m)) == NONE)
        return -1;
    m->c.map++;
    m->c.access++;
    m->maps[h]++;
    p->handle = h;
    m->user[h] = (int32_t)s;
    set_idle(m, h, false);
    return 0;
}

int alias_model_take(alias_model_t *m, uintptr_t addr, size_t size)
{
    if (!size)
        return 0;
    m->tick++;
    for (uint64_t n = addr / m->page; n <= (addr + size - 1) / m->page; n++) {
        page_t *p = page_get(m, n);
        if (!p)
            return -1;
        if (p->busy++ == 0 && page_busy(m, p, (size_t)(p - m->pages)))
            return -1;
    }
    return 0;
}

void alias_model_give(alias_model_t *m, uintptr_t addr, size_t size)
{
    if (!size)
        return;
    m->tick++;
    for (uint64_t n = addr / m->page; n <= (addr + size - 1) / m->page; n++) {
        page_t *p = &m->pages[slot_of(m, n + 1)];
        if (p->key && p->busy > 0 && --p->busy == 0)
            span_mark(m, p); /* room for the end was made with the start */
        if (p->key && p->busy == 0 && p->handle != NONE && m->user[p->handle] == (int32_t)(p - m->pages)) {
            m->user[p->handle] = NONE; /* idle; still mapped here */
            m->since[p->handle] = ++m->clock;
            set_idle(m, p->handle, true);
        }
    }
}

void alias_model_note_small(alias_model_t *m, uint64_t small_reserved)
{
    uint64_t total = (uint64_t)m->nhandles * m->page;
    total += small_reserved;
    if (total > m->c.peak_reserved)
        m->c.peak_reserved = total;
}

void alias_model_counts(const alias_model_t *m, alias_counts_t *c)
{
    *c = m->c;
}

double alias_model_us(const alias_counts_t *c, int col)
{
    return si_cost_us("cuMemCreate", c->create, 0, col) + si_cost_us("cuMemMap", c->map, 0, col) +
           si_cost_us("cuMemSetAccess", c->access, c->access, col) +
           si_cost_us("cuMemUnmap", c->unmap, c->unmap, col) + si_cost_us("cuStreamSynchronize", c->sync, 0, col);
}

/* ---- the static assignment --------------------------------------------- */

/* Whether sorted span lists a and b (start, end pairs) overlap. */
static bool spans_meet(const uint64_t *a, size_t na, const uint64_t *b, size_t nb)
{
    size_t i = 0, j = 0;
    while (i < na && j < nb) {
        uint64_t as = a[i], ae = i + 1 < na ? a[i + 1] : UINT64_MAX;
        uint64_t bs = b[j], be = j + 1 < nb ? b[j + 1] : UINT64_MAX;
        if (as < be && bs < ae)
            return true;
        if (ae <= be)
            i += 2;
        else
            j += 2;
    }
    return false;
}

static int by_first(const void *x, const void *y)
{
    const history_t *a = *(const history_t *const *)x, *b = *(const history_t *const *)y;
    return a->first < b->first ? -1 : a->first > b->first;
}

long alias_model_static(const alias_model_t *m)
{
    size_t n = 0;
    const history_t **order = malloc((m->nhist ? m->nhist : 1) * sizeof *order);
    if (!order)
        return -1;
    for (size_t i = 0; i < m->nhist; i++)
        if (m->hist[i].n)
            order[n++] = &m->hist[i];
    qsort(order, n, sizeof *order, by_first);
    /* Each handle's spans: the union of its pages', kept sorted. */
    typedef struct { uint64_t *span; size_t n, cap; } hspans_t;
    hspans_t *hs = calloc(n ? n : 1, sizeof *hs);
    long nh = 0;
    if (!hs) {
        free(order);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        const history_t *p = order[k];
        long h = 0;
        while (h < nh && spans_meet(hs[h].span, hs[h].n, p->span, p->n))
            h++;
        if (h == nh)
            nh++;
        hspans_t *t = &hs[h];
        uint64_t *merged = malloc((t->n + p->n) * sizeof *merged);
        if (!merged) {
            nh = -1;
            break;
        }
        /* Merge two disjoint sorted span lists (an open span only ever last). */
        size_t i = 0, j = 0, o = 0;
        while (i < t->n || j < p->n) {
            bool from_t = j >= p->n || (i < t->n && t->span[i] < p->span[j]);
            const uint64_t *src = from_t ? &t->span[i] : &p->span[j];
            size_t left = from_t ? t->n - i : p->n - j;
            merged[o++] = src[0];
            if (left > 1)
                merged[o++] = src[1];
            if (from_t)
                i += 2;
            else
                j += 2;
        }
        free(t->span);
        t->span = merged;
        t->n = o;
    }
    for (size_t k = 0; k < n; k++)
        free(hs[k].span);
    free(hs);
    free(order);
    return nh;
}

uint64_t alias_model_page(const alias_model_t *m)
{
    return m->page;
}
