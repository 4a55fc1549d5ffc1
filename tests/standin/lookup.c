/* The CUDA stand-in: the two name tables, entry points by name
 * (cuGetProcAddress, CUDA 11.3 form, and cuGetProcAddress_v2, CUDA 12.0 form
 * with a query result) and error codes to names (cuGetErrorName,
 * cuGetErrorString). Both work before cuInit: they touch no driver state.
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
 * at all, as on an old driver.
 *
 * Error names, for every CUresult driver.h declares. cuGetErrorName: 'Sets
 * *pStr to the address of a NULL-terminated string representation of the
 * name of the enum error code error. If the error code is not recognized,
 * CUDA_ERROR_INVALID_VALUE will be returned and *pStr will be set to the
 * NULL value.' cuGetErrorString likewise, with a description. */
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
#define SI_NENTRIES (sizeof si_entries / sizeof si_entries[0])

/* Later forms of names in si_entries, not in driver.h's list (which has
 * one per name): asked for at their version or later, cuGetProcAddress
 * returns them ('the function pointer to the corresponding versioned
 * function'). */
static const struct si_entry si_later_forms[] = {
    {"cuStreamGetCtx", TALLY_CU_STREAM_GET_CTX_V2, (si_fn)cuStreamGetCtx_v2},
};

static CUresult si_lookup(const char *symbol, void **pfn, int cuda_version, CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    int driver = si_driver_version();
    if (cuda_version > driver)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    for (size_t i = 0; i < SI_NENTRIES; i++) {
        const struct si_entry *e = &si_entries[i];
        if (strcmp(e->name, symbol) != 0 || e->version > driver)
            continue;
        if (cuda_version < e->version) {
            st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        } else {
            si_fn fn = e->fn;
            for (size_t k = 0; k < sizeof si_later_forms / sizeof si_later_forms[0]; k++) {
                const struct si_entry *l = &si_later_forms[k];
                if (strcmp(l->name, symbol) == 0 && l->version <= cuda_version && l->version <= driver)
                    fn = l->fn;
            }
            memcpy(pfn, &fn, sizeof fn);
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

/* ---- error names ------------------------------------------------------------ */
struct si_error {
    CUresult code;
    const char *name, *text;
};

#define SI_E(code, text) {code, #code, text}
static const struct si_error si_errors[] = {
    SI_E(CUDA_SUCCESS, "no error"),
    SI_E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    SI_E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    SI_E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    SI_E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    SI_E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    SI_E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    SI_E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    SI_E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    SI_E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    SI_E(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    SI_E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use"),
    SI_E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    SI_E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    SI_E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    SI_E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    SI_E(CUDA_ERROR_NOT_READY, "device not ready"),
    SI_E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    SI_E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    SI_E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    SI_E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process"),
    SI_E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    SI_E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    SI_E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    SI_E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    SI_E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "the capture was not begun on this stream"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "the capture has work forked off its origin stream and never joined back"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "the dependency would merge two separate captures"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
         "operation would make the legacy stream depend on a capturing blocking stream"),
    SI_E(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream"),
    SI_E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread"),
    SI_E(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef SI_E

static const struct si_error *si_error_find(CUresult code)
{
    for (size_t i = 0; i < sizeof si_errors / sizeof si_errors[0]; i++)
        if (si_errors[i].code == code)
            return &si_errors[i];
    return NULL;
}

CUresult cuGetErrorName(CUresult error, const char **name)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    const struct si_error *e = si_error_find(error);
    *name = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **text)
{
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    const struct si_error *e = si_error_find(error);
    *text = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
