/* The CUDA stand-in: how many times each entry point was called, the
 * mappings the per-mapping calls touched, and the modelled driver time of
 * it all (cost.h's table). Not CUDA: the stand-in's own instrument, so a
 * test can assert how many driver calls a path makes and bench/ can say
 * what they would cost on a real GPU.
 *
 * Every entry point that goes through SI_ENTER is counted, before its
 * arguments are checked (a refused call still went to the driver). The
 * counters are process-wide atomics; cuda_standin_counts_reset zeroes them.
 *
 * Exported for tests and benchmarks, found with dlsym on the loaded
 * libcuda.so.1:
 *   unsigned long long cuda_standin_calls(const char *entry)   calls of entry ("" or NULL: all)
 *   unsigned long long cuda_standin_mappings(const char *entry) mappings its calls touched
 *   double cuda_standin_driver_us(int column)                  modelled time, SI_COST_A100 / _BLACKWELL
 *   int cuda_standin_counts_write(char *buf, size_t len)       "name calls mappings" lines, nonzero only
 *   void cuda_standin_counts_reset(void) */
#include "standin.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cost.h"

#define SI_COUNTED_MAX 96

static struct {
    char name[48];
    _Atomic unsigned long long calls, mappings;
} counted[SI_COUNTED_MAX];
static _Atomic int ncounted;
static pthread_mutex_t counted_lock = PTHREAD_MUTEX_INITIALIZER;

/* The plain name of an entry point's __func__ (cuMemAlloc_v2 -> cuMemAlloc,
 * as driver.h lists it), in out[48]. */
static void plain_name(const char *func, char *out)
{
    snprintf(out, 48, "%s", func);
    size_t n = strlen(out);
    if (n > 3 && out[n - 3] == '_' && out[n - 2] == 'v' && out[n - 1] >= '2' && out[n - 1] <= '9')
        out[n - 3] = 0;
}

/* The slot of name (a plain name), made on first use. */
static int slot_of(const char *name)
{
    int n = atomic_load(&ncounted);
    for (int i = 0; i < n; i++)
        if (strcmp(counted[i].name, name) == 0)
            return i;
    pthread_mutex_lock(&counted_lock);
    n = atomic_load(&ncounted);
    int i;
    for (i = 0; i < n; i++)
        if (strcmp(counted[i].name, name) == 0)
            break;
    if (i == n && n < SI_COUNTED_MAX) {
        snprintf(counted[n].name, sizeof counted[n].name, "%s", name);
        atomic_store(&ncounted, n + 1);
    }
    pthread_mutex_unlock(&counted_lock);
    return i < SI_COUNTED_MAX ? i : -1;
}

void si_count_call(_Atomic int *slot, const char *func)
{
    int i = atomic_load_explicit(slot, memory_order_relaxed);
    if (i < 0) {
        char name[48];
        plain_name(func, name);
        i = slot_of(name);
        atomic_store_explicit(slot, i, memory_order_relaxed);
    }
    if (i >= 0)
        atomic_fetch_add_explicit(&counted[i].calls, 1, memory_order_relaxed);
}

void si_count_mappings(const char *func, unsigned long long n)
{
    char name[48];
    plain_name(func, name);
    int slot = slot_of(name);
    if (slot >= 0)
        atomic_fetch_add_explicit(&counted[slot].mappings, n, memory_order_relaxed);
}

SI_EXPORT unsigned long long cuda_standin_calls(const char *entry)
{
    unsigned long long total = 0;
    int n = atomic_load(&ncounted);
    for (int i = 0; i < n; i++)
        if (!entry || !*entry || strcmp(counted[i].name, entry) == 0)
            total += atomic_load(&counted[i].calls);
    return total;
}

SI_EXPORT unsigned long long cuda_standin_mappings(const char *entry)
{
    int n = atomic_load(&ncounted);
    for (int i = 0; i < n; i++)
        if (entry && strcmp(counted[i].name, entry) == 0)
            return atomic_load(&counted[i].mappings);
    return 0;
}

SI_EXPORT double cuda_standin_driver_us(int column)
{
    double us = 0;
    int n = atomic_load(&ncounted);
    for (int i = 0; i < n; i++)
        us += si_cost_us(counted[i].name, atomic_load(&counted[i].calls), atomic_load(&counted[i].mappings), column);
    return us;
}

SI_EXPORT int cuda_standin_counts_write(char *buf, size_t len)
{
    size_t at = 0;
    int n = atomic_load(&ncounted);
    if (len)
        buf[0] = 0;
    for (int i = 0; i < n; i++) {
        unsigned long long c = atomic_load(&counted[i].calls), m = atomic_load(&counted[i].mappings);
        if (!c)
            continue;
        int w = snprintf(buf + at, at < len ? len - at : 0, "%s %llu %llu\n", counted[i].name, c, m);
        if (w < 0 || (size_t)w >= (at < len ? len - at : 0))
            return -1;
        at += (size_t)w;
    }
    return (int)at;
}

SI_EXPORT void cuda_standin_counts_reset(void)
{
    int n = atomic_load(&ncounted);
    for (int i = 0; i < n; i++) {
        atomic_store(&counted[i].calls, 0);
        atomic_store(&counted[i].mappings, 0);
    }
}
