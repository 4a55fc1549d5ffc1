/* The public CUDA graph pool entry points (include/tally.h): initialise,
 * then the cache's graph pools (lib/cache/graph_pool.c) do the work. The
 * C API's counterpart of PyTorch's begin/end/release hooks
 * (lib/torch/torch_graph.cc). */
#include "api/api.h"

#include <stdatomic.h>

void tally_graph_captures_announced(void)
{
    atomic_store(&tally__g.announces, true);
}

int tally_graph_pool_begin(int device, uint64_t id_hi, uint64_t id_lo, int (*filter)(void *arg, void *stream),
                           void *arg)
{
    int rc = tally__ensure_init();
    return rc ? rc : tally__graph_pool_begin(device, id_hi, id_lo, filter, arg);
}

int tally_graph_pool_end(int device, uint64_t id_hi, uint64_t id_lo)
{
    int rc = tally__ensure_init();
    return rc ? rc : tally__graph_pool_end(device, id_hi, id_lo);
}

int tally_graph_pool_release(int device, uint64_t id_hi, uint64_t id_lo)
{
    int rc = tally__ensure_init();
    return rc ? rc : tally__graph_pool_release(device, id_hi, id_lo);
}
