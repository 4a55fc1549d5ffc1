/* The page bitmaps of a reservation at its far end (lib/backend/cuda/vmm.c):
 * each reservation keeps one bit per 2 MiB page for "mapped" and one for
 * "a physical handle starts here", in arrays of 64-bit words sized from its
 * page count. A reservation of 64 * k + 1 pages needs k + 1 words; its last
 * page's bits are in the last word, which an array one word short would put
 * past its end. Under `make asan` tally's metadata heap poisons the bytes
 * past each array (lib/core/meta.c), so such a write is reported; without
 * ASan this test checks the same pages' bookkeeping through the backend.
 *
 * Helpers are in vmmutil.h (each body runs in a forked child on the CUDA
 * stand-in, or on a GPU with TALLY_REAL_CUDA=1). */
#include "vmmutil.h"

#include "core/internal.h"

/* Reserve npages pages; map its first page and its last two as one-page
 * handles; unmap the last (a handle that starts on it) and then the one
 * before; unreserve. The mapped bytes follow each step. */
static void far_end(size_t npages)
{
    const tally_backend_t *be = &tally__backend_cuda;
    char why[256] = "";
    void *r = NULL;
    NEED(be->reserve(0, npages * PAGE, &r, why, sizeof why) == 0);
    char *p = r;
    NEED(be->map(0, p, PAGE, PAGE, why, sizeof why) == 0);
    NEED(be->map(0, p + (npages - 2) * PAGE, 2 * PAGE, PAGE, why, sizeof why) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    /* The last page is a handle of its own: it unmaps alone. */
    NEED(be->unmap(0, p + (npages - 1) * PAGE, PAGE) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 2 * PAGE);
    NEED(be->unmap(0, p + (npages - 2) * PAGE, PAGE) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == PAGE);
    /* Mapped again, as one handle of two pages: cutting it is refused. */
    NEED(be->map(0, p + (npages - 2) * PAGE, 2 * PAGE, 2 * PAGE, why, sizeof why) == 0);
    NEED(be->unmap(0, p + (npages - 1) * PAGE, PAGE) == TALLY_EBACKEND);
    NEED(strstr(tally_last_error(), "would cut a physical handle") != NULL);
    NEED(tally__cu_vmm_mapped_bytes(0) == 3 * PAGE);
    NEED(be->unreserve(0, r, npages * PAGE) == 0);
    NEED(tally__cu_vmm_mapped_bytes(0) == 0);
}

static void body_far_end(int fd)
{
    (void)fd;
    start_driver();
    NEED(tally_init() == 0);
    /* 321 = 5 * 64 + 1 pages (642 MiB of addresses; three pages mapped at
     * most), and 4161 = 65 * 64 + 1, where a word count from pages / 65
     * instead of pages / 64 falls one short. */
    far_end(321);
    far_end(4161);
    /* Exactly 64 pages: one word, the last page its top bit. */
    far_end(64);
}

static const char *const env_cuda[] = {"CUDA_STANDIN_DEVICES", "1", "TALLY_CONF", "backend:cuda,leak_report:off", NULL};

static void test_vmm_last_page_of_a_large_reservation(void **state)
{
    (void)state;
    expect_child_ok(env_cuda, body_far_end);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vmm_last_page_of_a_large_reservation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
