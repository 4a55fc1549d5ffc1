// PyTorch's CUDA graph pool hooks for a pluggable allocator, reached from
// Python through the allocator object's set_begin_allocate_to_pool,
// set_end_allocate_to_pool_fn and set_release_pool (python/tally/_torch.py).
// PyTorch calls them with C++ types: the pool id is c10::cuda::MempoolId_t
// (std::pair<unsigned long long, unsigned long long>) and the filter, which
// says whether an allocation on a stream belongs to the capture, is a
// std::function<bool(cudaStream_t)>. They forward to the C API
// (tally_graph_pool_begin / _end / _release, lib/cache/graph_pool.c).
//
// The filter is kept alive here, one copy per (device, pool), from begin to
// end; tally calls it through call_filter with a device lock held. Built into
// libtally.so only (like torch_oom.cc); libtally.a stays C.
#define TALLY_BUILDING_LIBRARY 1 // export the hooks (TALLY_API)
#include "tally.h"

#include <map>
#include <mutex>
#include <tuple>

namespace {

using filter_fn = std::function<bool(CUstream_st *)>;
using pool_key = std::tuple<int, unsigned long long, unsigned long long>;

std::mutex filters_lock;
std::map<pool_key, filter_fn *> &filters()
{
    static auto *m = new std::map<pool_key, filter_fn *>(); // never destroyed: frees may run at exit
    return *m;
}

int call_filter(void *arg, void *stream)
{
    try {
        return (*static_cast<filter_fn *>(arg))(static_cast<CUstream_st *>(stream)) ? 1 : 0;
    } catch (...) {
        return 0; // a filter that throws (a failed CUDA query) does not claim the allocation
    }
}

void drop_filter(int device, tally_mempool_id_t pool)
{
    filter_fn *old = nullptr;
    {
        std::lock_guard<std::mutex> g(filters_lock);
        auto it = filters().find(pool_key(device, pool.first, pool.second));
        if (it != filters().end()) {
            old = it->second;
            filters().erase(it);
        }
    }
    delete old;
}

} // namespace

extern "C" void tally_torch_begin_allocate_to_pool(int device, tally_mempool_id_t pool,
                                                   std::function<bool(CUstream_st *)> filter)
{
    filter_fn *kept = filter ? new filter_fn(std::move(filter)) : nullptr;
    {
        std::lock_guard<std::mutex> g(filters_lock);
        auto &slot = filters()[pool_key(device, pool.first, pool.second)];
        if (slot) {
            // begin twice without end: tally refuses below and keeps the first filter
            tally_graph_pool_begin(device, pool.first, pool.second, nullptr, nullptr);
            delete kept;
            return;
        }
        slot = kept;
    }
    if (tally_graph_pool_begin(device, pool.first, pool.second, kept ? call_filter : nullptr, kept) != 0)
        drop_filter(device, pool);
}

extern "C" void tally_torch_end_allocate_to_pool(int device, tally_mempool_id_t pool)
{
    tally_graph_pool_end(device, pool.first, pool.second);
    drop_filter(device, pool);
}

extern "C" void tally_torch_release_pool(int device, tally_mempool_id_t pool)
{
    tally_graph_pool_release(device, pool.first, pool.second);
    drop_filter(device, pool);
}
