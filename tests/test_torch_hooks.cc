// The PyTorch hooks that need C++ to test: the OOM raiser
// (tally_torch_set_oom_raiser), whose exception must travel out of
// tally_torch_alloc through the library's C frames to the caller, as
// c10::OutOfMemoryError does from the Python package's shim into PyTorch;
// and base_alloc (tally_torch_base_alloc), the segment holding a pointer.
//
// Linked with libtally.so as PyTorch loads it: without a raiser, alloc throws
// the fallback std::runtime_error (lib/torch/torch_oom.cc); with one, the raiser's
// own exception type arrives.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" { // cmocka's header declares its functions for C only
#include <cmocka.h>
}

#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "tally.h"

namespace {

const size_t MiB = size_t(1) << 20;

// What a raiser of the test throws: not a std::runtime_error, so only a
// raiser that really ran can produce it.
struct test_error : std::exception {
    int oom;
    std::string msg;
    test_error(int o, const char *m) : oom(o), msg(m ? m : "") {}
    const char *what() const noexcept override { return msg.c_str(); }
};

int raised;

extern "C" void throwing_raiser(int oom, const char *message)
{
    raised++;
    throw test_error(oom, message);
}

extern "C" void returning_raiser(int, const char *)
{
    raised++;
}

std::string diag;

extern "C" void capture(void *, const char *text, size_t len)
{
    diag.append(text, len);
}

int setup(void **)
{
    // A 64 MiB device: 1 GiB is an out-of-memory.
    if (tally_configure("backend:host,host_devices:1,host_capacity:64MiB,leak_report:off") || tally_init())
        return -1;
    tally_set_sink(capture, nullptr);
    return 0;
}

// No raiser set: libtally.so's fallback (lib/torch/torch_oom.cc) throws
// std::runtime_error with the same message.
void test_without_raiser_alloc_throws_runtime_error(void **)
{
    tally_torch_set_oom_raiser(nullptr);
    assert_int_equal(tally_torch_oom_raises(), 1);
    bool caught = false;
    try {
        tally_torch_alloc(size_t(1) << 30, 0, nullptr);
    } catch (const std::runtime_error &e) {
        caught = std::strncmp(e.what(), "CUDA out of memory.", 19) == 0;
    }
    assert_true(caught);
}

void test_raiser_exception_leaves_alloc(void **)
{
    tally_torch_set_oom_raiser(throwing_raiser);
    assert_int_equal(tally_torch_oom_raises(), 1);
    raised = 0;
    bool caught = false;
    try {
        tally_torch_alloc(size_t(1) << 30, 0, nullptr);
    } catch (const test_error &e) {
        caught = true;
        assert_int_equal(e.oom, 1);
        const char *want = "CUDA out of memory. Tried to allocate 1.00 GiB on device 0. tally: out of memory";
        if (e.msg.compare(0, std::strlen(want), want) != 0)
            fail_msg("message: %s", e.msg.c_str());
    }
    assert_true(caught);
    assert_int_equal(raised, 1);
    // The device is usable afterwards and the state is whole.
    void *p = tally_torch_alloc(MiB, 0, nullptr);
    assert_non_null(p);
    tally_torch_free(p, MiB, 0, nullptr);
    assert_int_equal(tally_check(), 0);
    tally_torch_set_oom_raiser(nullptr);
}

void test_raiser_gets_other_failures_as_not_oom(void **)
{
    tally_torch_set_oom_raiser(throwing_raiser);
    bool caught = false;
    try {
        tally_torch_alloc(4096, 7, nullptr); // no device 7
    } catch (const test_error &e) {
        caught = true;
        assert_int_equal(e.oom, 0);
        if (e.msg.find("device 7 does not exist") == std::string::npos)
            fail_msg("message: %s", e.msg.c_str());
    }
    assert_true(caught);
    tally_torch_set_oom_raiser(nullptr);
}

void test_raiser_that_returns_gives_null(void **)
{
    tally_torch_set_oom_raiser(returning_raiser);
    raised = 0;
    assert_null(tally_torch_alloc(size_t(1) << 30, 0, nullptr));
    assert_int_equal(raised, 1);
    tally_torch_set_oom_raiser(nullptr);
}

void test_base_alloc_is_the_segment(void **)
{
    // Two small blocks share one 2 MiB small-pool segment.
    char *a = static_cast<char *>(tally_torch_alloc(1000, 0, nullptr));
    char *b = static_cast<char *>(tally_torch_alloc(3000, 0, nullptr));
    char *big = static_cast<char *>(tally_torch_alloc(30 * MiB, 0, nullptr));
    assert_true(a && b && big);
    size_t sa = 0, sb = 0, sbig = 0;
    char *base_a = static_cast<char *>(tally_torch_base_alloc(a, &sa));
    char *base_b = static_cast<char *>(tally_torch_base_alloc(b, &sb));
    assert_ptr_equal(base_a, base_b);
    assert_int_equal(sa, 2 * MiB);
    assert_int_equal(sb, 2 * MiB);
    assert_true(base_b <= b && b < base_b + sb);
    assert_ptr_equal(tally_torch_base_alloc(big, &sbig), big); // a large request gets its own segment
    assert_int_equal(sbig, 30 * MiB);
    // An interior pointer belongs to the same segment.
    size_t si = 0;
    assert_ptr_equal(tally_torch_base_alloc(big + 12345, &si), big);
    assert_int_equal(si, 30 * MiB);
    tally_torch_free(a, 1000, 0, nullptr);
    tally_torch_free(b, 3000, 0, nullptr);
    tally_torch_free(big, 30 * MiB, 0, nullptr);
}

void test_base_alloc_bad_input(void **)
{
    int local = 0;
    size_t size = 99;
    diag.clear();
    assert_null(tally_torch_base_alloc(&local, &size));
    assert_int_equal(size, 0);
    if (diag.find("tally_torch_base_alloc: ") == std::string::npos ||
        diag.find("is not inside any segment of tally\n") == std::string::npos)
        fail_msg("diagnostics: %s", diag.c_str());
    assert_string_equal(tally_last_error() + std::strlen(tally_last_error()) - 34, "is not inside any segment of tally");
    diag.clear();
    assert_null(tally_torch_base_alloc(&local, nullptr));
    assert_string_equal(diag.c_str(), "tally: tally_torch_base_alloc: size is NULL\n");
    size = 5;
    assert_null(tally_torch_base_alloc(nullptr, &size));
    assert_int_equal(size, 0);
}

} // namespace

int main()
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_raiser_alloc_throws_runtime_error),
        cmocka_unit_test(test_raiser_exception_leaves_alloc),
        cmocka_unit_test(test_raiser_gets_other_failures_as_not_oom),
        cmocka_unit_test(test_raiser_that_returns_gives_null),
        cmocka_unit_test(test_base_alloc_is_the_segment),
        cmocka_unit_test(test_base_alloc_bad_input),
    };
    return cmocka_run_group_tests_name("torch_hooks", tests, setup, nullptr);
}
