/* The CUDA stand-in: cuGetProcAddress (CUDA 11.3 form) and
 * cuGetProcAddress_v2 (CUDA 12.0 form, with a query result).
 *
 * The table maps each plain name of driver.h's TALLY_CU_ENTRY_POINTS to the
 * implementation of the signature declared there, which first appeared in
 * CUDA `version`. Rules (cuGetProcAddress, cuda.h):
 * - 'For a requested driver symbol, if the specified CUDA version is greater
 *   than or equal to the CUDA version in which the driver symbol was
 *   introduced, this API will return the function pointer to the
 *   corresponding versioned function.'
 * - 'If the specified CUDA version is greater than the driver version, the
 *   API will return CUDA_ERROR_INVALID_VALUE.'
 * - 'The API will return CUDA_SUCCESS and set the returned pfn to NULL if the
 *   requested driver function is not supported on the platform, no ABI
 *   compatible driver function exists for the specified cudaVersion or if
 *   the driver symbol is invalid', with symbolStatus
 *   CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND ('The requested symbol was not
 *   found') or CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ('The requested
 *   symbol was found but is not supported by cudaVersion specified').
 * The stand-in only knows the signatures driver.h declares, so a version
 * below the declared one finds no ABI-compatible function; an entry point
 * newer than the modelled driver (CUDA_STANDIN_DRIVER_VERSION) is not found
 * at all, as on an old driver. Both forms work before cuInit. */
#include "standin.h"

#include <string.h>

typedef void (*si_fn)(void);

struct si_entry {
    const char *name;
    int version;
    si_fn fn;
};

/* #name is the plain name; `name` expands to the exported (versioned) one. */
#define SI_ENTRY(name, version, required, params) {#name, version, (si_fn)name},
static const struct si_entry si_entries[] = {TALLY_CU_ENTRY_POINTS(SI_ENTRY)};
#undef SI_ENTRY

static CUresult si_lookup(const char *symbol, void **pfn, int cuda_version, CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    int driver = si_driver_version();
    if (cuda_version > driver)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    for (size_t i = 0; i < sizeof si_entries / sizeof si_entries[0]; i++) {
        const struct si_entry *e = &si_entries[i];
        if (strcmp(e->name, symbol) != 0 || e->version > driver)
            continue;
        if (cuda_version < e->version) {
            st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        } else {
            memcpy(pfn, &e->fn, sizeof e->fn);
            st = CU_GET_PROC_ADDRESS_SUCCESS;
        }
        break;
    }
    if (status)
        *status = st;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    return si_lookup(symbol, pfn, cuda_version, status);
}

SI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    return si_lookup(symbol, pfn, cuda_version, NULL);
}
