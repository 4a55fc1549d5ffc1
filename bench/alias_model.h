/* A model of one lever issue 21 names for expandable segments, measured
 * before it is built: map an idle physical handle at a second address
 * instead of moving it (CUDA's virtual aliasing; docs/benchmarks.md, run N).
 *
 * It watches the large-pool blocks of a replay through tally (their
 * addresses and sizes, as tally placed them) and keeps, for every 2 MiB page
 * of address space, whether a live block touches it ("busy"). Physical
 * memory is modelled as handles of one page each (2 MiB, or a multiple),
 * each mapped at any number of pages but used by at most one busy page at a
 * time:
 * - a page that becomes busy uses the handle mapped there when that handle
 *   is idle (no driver call); else, if its handle is busy at another page,
 *   the page is unmapped (a synchronise and a cuMemUnmap) and takes another
 *   handle (cuMemMap + cuMemSetAccess): an idle one the policy chooses, or a
 *   new one (cuMemCreate as well) when none is idle or the policy says so;
 * - a page that stops being busy keeps its mapping: its handle is idle, free
 *   for this page again or for any other page (an alias).
 * Handles are never released (no empty_cache in the model). Reserved memory
 * is the handles plus what the small pool holds (tally's own figure), so a
 * replay gives the peak such a policy would reach with tally's placement, and
 * the driver calls it would make, step by step. The placement is the one
 * tally chose without aliasing: a policy that knew about it could place
 * differently. */
#ifndef TALLY_BENCH_ALIAS_MODEL_H
#define TALLY_BENCH_ALIAS_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct alias_counts {
    uint64_t create, map, access, unmap, sync; /* driver calls made so far */
    uint64_t handles;                          /* handles made so far (2 MiB each) */
    uint64_t peak_reserved;                    /* handles plus the small pool, at its highest */
} alias_counts_t;

typedef struct alias_model alias_model_t;

/* Which idle handle a page takes. */
enum {
    ALIAS_LOWEST, /* the lowest-numbered */
    ALIAS_LRU,    /* the one idle the longest */
    ALIAS_MRU,    /* the one idle the shortest */
    ALIAS_FEWEST, /* the one mapped at the fewest pages */
    ALIAS_OWN     /* the lowest-numbered at a page's first use; after a conflict a new handle of its own */
};

/* A model with nothing mapped, its pages (and handles) `pages` x 2 MiB;
 * NULL out of memory. */
alias_model_t *alias_model_new(int policy, unsigned pages);
void alias_model_free(alias_model_t *m);
/* A large-pool block of size bytes became live at addr / stopped being live. */
int alias_model_take(alias_model_t *m, uintptr_t addr, size_t size);
void alias_model_give(alias_model_t *m, uintptr_t addr, size_t size);
/* After each event: the small pool's reserved bytes now (for the peak). */
void alias_model_note_small(alias_model_t *m, uint64_t small_reserved);
void alias_model_counts(const alias_model_t *m, alias_counts_t *c);
/* The size of its pages and handles, in bytes. */
uint64_t alias_model_page(const alias_model_t *m);
/* The handles a static assignment needs: each page that was ever busy gets
 * one handle for the whole replay (mapped once, never moved: no driver call
 * after its first use), pages whose busy spans never meet sharing one;
 * greedy, pages in the order they first became busy. -1 out of memory. */
long alias_model_static(const alias_model_t *m);
/* The modelled driver time of c (cost column col of tests/standin/cost.h), in microseconds. */
double alias_model_us(const alias_counts_t *c, int col);

#endif
