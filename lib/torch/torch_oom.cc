// The one C++ piece of tally: turns a failed tally_torch_alloc into a C++
// exception. PyTorch does not check the pointer a pluggable allocator returns,
// but its Python bindings catch C++ exceptions and raise them as RuntimeError
// (RMM reports OOM the same way), so this is how an out-of-memory reaches
// Python as an error that can be caught instead of as a NULL tensor.
//
// lib/torch/torch_abi.c calls tally__torch_raise through a weak reference: the
// library links without this file (alloc then returns NULL). It belongs in
// libtally.so only; C programs using libtally.a never reach it.
#include <stdexcept>
#include <string>

namespace {

// A distinct type, so C++ callers can tell tally's OOM from other errors; it
// is still a std::runtime_error, which is what PyTorch maps to RuntimeError.
class tally_out_of_memory : public std::runtime_error {
public:
    explicit tally_out_of_memory(const std::string &what) : std::runtime_error(what) {}
};

} // namespace

extern "C" __attribute__((visibility("hidden"))) void tally__torch_raise(int oom, const char *message)
{
    std::string what = message ? message : "tally: allocation failed";
    if (oom)
        throw tally_out_of_memory(what);
    throw std::runtime_error(what);
}
