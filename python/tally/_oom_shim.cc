// tally's OOM shim: compiled by tally/_oom_shim.py against the installed
// PyTorch's headers and libc10, and handed to libtally.so with
// tally_torch_set_oom_raiser. tally_torch_alloc calls it when an allocation
// fails. It throws c10's own exception types, so that PyTorch sees what its
// native allocator would throw: c10::OutOfMemoryError for out-of-memory
// (cuDNN then retries with a smaller workspace, and Python gets
// torch.cuda.OutOfMemoryError), c10::Error for any other failure (Python:
// RuntimeError). c10::Error's (SourceLocation, message) constructor is
// defined in libc10, hence the link against it.
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

extern "C" __attribute__((visibility("default"))) void tally_oom_shim_raise(int oom, const char *message)
{
    std::string what = message ? message : "tally: allocation failed";
    c10::SourceLocation where{__func__, __FILE__, static_cast<uint32_t>(__LINE__)};
    if (oom)
        throw c10::OutOfMemoryError(where, what);
    throw c10::Error(where, what);
}
