/* The driver cost table (cost.h). Figures are those ../shared/cuda.md
 * gathers ("What the calls cost on a real GPU"): the A100 80 GB column from
 * kvcached's virtual-memory benchmark (benchmarks/bench_vmm/README.md, one
 * thread, 2 MiB pages), the Blackwell column from a probe on an RTX PRO 6000
 * Blackwell. docs/benchmarks.md prints the table with its sources. */
#include "cost.h"

#include <string.h>

static const si_cost_row_t rows[] = {
    {"cuMemCreate", SI_PER_CALL, {193.0, 13.8},
     "A100: kvcached bench_vmm, 193 us per 2 MiB handle (p99 381); Blackwell: probe, 13.8 us. One handle per call, "
     "whatever its size (PyTorch's note)"},
    {"cuMemMap", SI_PER_CALL, {1.45, 1.0}, "A100: kvcached bench_vmm, 1.45 us; Blackwell: probe, 1.0 us"},
    {"cuMemSetAccess", SI_PER_MAPPING, {36.0, 69.0},
     "A100: kvcached bench_vmm, 36 us for one 2 MiB mapping; Blackwell: probe, about 69 us per 2 MiB mapping even "
     "inside one call. Charged per mapping the range covers"},
    {"cuMemUnmap", SI_PER_MAPPING, {25.6, 39.0},
     "A100: kvcached bench_vmm, 25.6 us for one 2 MiB mapping; Blackwell: probe, about 39 us per mapping. Charged per "
     "mapping the range covers"},
    {"cuMemRelease", SI_PER_CALL, {25.6, 39.0},
     "assumed: no published figure; taken as cuMemUnmap's per-mapping cost (it gives the physical memory back)"},
    {"cuMemAddressReserve", SI_PER_CALL, {19.0, 19.0},
     "A100: kvcached bench_vmm, 19 us for 8 GB; Blackwell: assumed the same"},
    {"cuMemAddressFree", SI_PER_CALL, {19.0, 19.0}, "assumed: as cuMemAddressReserve"},
    {"cuMemAlloc", SI_PER_CALL, {230.45, 83.8},
     "assumed: one cuMemCreate + cuMemMap + cuMemSetAccess of one mapping (what the driver does for a segment)"},
    {"cuMemFree", SI_PER_CALL, {51.2, 78.0}, "assumed: one cuMemUnmap + cuMemRelease of one mapping"},
    {"cuMemAllocAsync", SI_PER_CALL, {2.0, 2.0},
     "assumed: served from the pool's reserve, a stream-ordered call like an event record"},
    {"cuMemFreeAsync", SI_PER_CALL, {2.0, 2.0}, "assumed: as cuMemAllocAsync"},
    {"cuCtxSynchronize", SI_PER_CALL, {20.0, 20.0},
     "assumed: a fixed 20 us on an idle device; the work it waits for is not modelled"},
    {"cuStreamSynchronize", SI_PER_CALL, {20.0, 20.0}, "assumed: as cuCtxSynchronize"},
    {"cuEventSynchronize", SI_PER_CALL, {20.0, 20.0}, "assumed: as cuCtxSynchronize"},
    {"cuEventRecord", SI_PER_CALL, {2.0, 2.0}, "assumed: 2 us, an enqueue on the stream"},
    {"cuEventQuery", SI_PER_CALL, {1.0, 1.0}, "assumed: 1 us, a read of the event's state"},
    {"cuStreamWaitEvent", SI_PER_CALL, {2.0, 2.0}, "assumed: as cuEventRecord"},
};

const double si_cost_other_us = 0.5;

const si_cost_row_t *si_cost_table(size_t *n)
{
    *n = sizeof rows / sizeof rows[0];
    return rows;
}

const si_cost_row_t *si_cost_row(const char *entry)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (strcmp(rows[i].entry, entry) == 0)
            return &rows[i];
    return NULL;
}

double si_cost_us(const char *entry, uint64_t calls, uint64_t mappings, int column)
{
    const si_cost_row_t *r = si_cost_row(entry);
    if (column < 0 || column >= SI_COST_COLUMNS)
        return 0;
    if (!r)
        return (double)calls * si_cost_other_us;
    return r->law == SI_PER_MAPPING ? (double)mappings * r->us[column] : (double)calls * r->us[column];
}

const char *si_cost_column_name(int column)
{
    return column == SI_COST_A100 ? "A100" : column == SI_COST_BLACKWELL ? "Blackwell" : "?";
}
