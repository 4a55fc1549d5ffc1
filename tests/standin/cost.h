/* The driver cost model: what each CUDA driver call is taken to cost on a
 * real GPU, so that the CUDA path's speed can be judged without one.
 *
 * One row per entry point, each with the source of its figures. The cost law
 * is per call, or for the calls whose published cost grows with the number
 * of mappings they touch (cuMemSetAccess, cuMemUnmap) per mapping: never per
 * byte (PyTorch's note on expandable segments: mapping cost grows with the
 * number of handles, "10 x 2 MiB takes 10x as long as one 20 MiB"). Two
 * columns: an A100 80 GB and an RTX PRO 6000 Blackwell. Where nothing is
 * published the row says what it assumes. A synchronise costs a fixed,
 * stated figure (the work it waits for is not modelled).
 *
 * Used by the stand-in (tests/standin/, which charges each call it serves:
 * cuda_standin_driver_us), by bench/ (tally-replay and pt-expand-model, the
 * model of PyTorch's expandable segments, counted with the same table) and
 * by tally tune. Plain C, no stand-in state: it links into any program. */
#ifndef TALLY_STANDIN_COST_H
#define TALLY_STANDIN_COST_H

#include <stddef.h>
#include <stdint.h>

enum { SI_COST_A100, SI_COST_BLACKWELL, SI_COST_COLUMNS };
enum { SI_PER_CALL, SI_PER_MAPPING };

typedef struct si_cost_row {
    const char *entry;                /* the driver entry point's plain name */
    int law;                          /* SI_PER_CALL or SI_PER_MAPPING */
    double us[SI_COST_COLUMNS];       /* microseconds per call or per mapping */
    const char *source;               /* where the figures come from, or the assumption */
} si_cost_row_t;

/* The table; *n rows. */
const si_cost_row_t *si_cost_table(size_t *n);
/* The row of entry, or NULL (an entry point outside the table costs
 * si_cost_other_us per call). */
const si_cost_row_t *si_cost_row(const char *entry);
/* Modelled microseconds of `calls` calls of entry that touched `mappings`
 * mappings in all (per-mapping rows; per-call rows ignore it). */
double si_cost_us(const char *entry, uint64_t calls, uint64_t mappings, int column);
/* The column's name ("A100", "Blackwell"). */
const char *si_cost_column_name(int column);
/* Every entry point outside the table (context, stream and event calls):
 * an assumed figure per call. */
extern const double si_cost_other_us;

#endif
