/* Python frames of an allocation (python_stack:N), as PyTorch records them
 * for its memory snapshots.
 *
 * CPython is found at run time with dlsym(RTLD_DEFAULT): libtally.so does
 * not link against libpython, and a process without an interpreter pays one
 * failed look-up. Only functions of CPython's public C API are called, never
 * a struct field or macro, because frame and code object layouts change in
 * every release (3.11 moved frames into _PyInterpreterFrame):
 *   Py_IsInitialized, Py_IsFinalizing (3.13) / _Py_IsFinalizing (3.9-3.12),
 *   PyGILState_GetThisThreadState, PyGILState_Ensure, PyGILState_Release,
 *   PyEval_GetFrame, PyFrame_GetCode, PyFrame_GetBack (both added in 3.9 as
 *   the replacement for reading f_code / f_back), PyFrame_GetLineNumber,
 *   PyObject_GetAttrString, PyUnicode_AsUTF8, Py_IncRef, Py_DecRef.
 * They exist with the same signatures in CPython 3.9 to 3.13.
 *
 * A thread without a Python thread state (PyTorch's autograd workers, any
 * C++ thread) returns at once and records nothing. A thread with one takes
 * the GIL (PyTorch releases it before dispatching an op, as ctypes does
 * around a foreign call), reads its frames and releases it; the caller holds
 * no tally lock, so waiting for the GIL cannot deadlock with tally.
 *
 * Interning: a code object is named once (co_filename, co_name read through
 * getattr the first time it is seen; tally keeps a reference so its address
 * is never reused), and a site, the list of (file, line, function), is
 * stored once. A loop that allocates from one line pays hash look-ups, not
 * strings. */
#include "ledger/site.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

typedef struct _object PyObject;
static struct {
    int (*is_initialized)(void);
    int (*is_finalizing)(void);
    void *(*this_tstate)(void);
    int (*gil_ensure)(void);
    void (*gil_release)(int);
    PyObject *(*get_frame)(void);
    PyObject *(*frame_code)(PyObject *);
    PyObject *(*frame_back)(PyObject *);
    int (*frame_line)(PyObject *);
    PyObject *(*getattr)(PyObject *, const char *);
    const char *(*utf8)(PyObject *);
    void (*incref)(PyObject *);
    void (*decref)(PyObject *);
} py;
static _Atomic int py_state; /* 0 not looked up, 1 found, -1 absent */
static tally_mutex_t py_lock = TALLY_MUTEX_INIT;
tally_mutex_t *tally__pystack_lock(void) { return &py_lock; }

static int py_sym(void *field, const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    if (p)
        memcpy(field, &p, sizeof p);
    return p ? 0 : -1;
}

static int py_resolve(void)
{
    int bad = py_sym(&py.is_initialized, "Py_IsInitialized") | py_sym(&py.this_tstate, "PyGILState_GetThisThreadState") |
              py_sym(&py.gil_ensure, "PyGILState_Ensure") | py_sym(&py.gil_release, "PyGILState_Release") |
              py_sym(&py.get_frame, "PyEval_GetFrame") | py_sym(&py.frame_code, "PyFrame_GetCode") |
              py_sym(&py.frame_back, "PyFrame_GetBack") | py_sym(&py.frame_line, "PyFrame_GetLineNumber") |
              py_sym(&py.getattr, "PyObject_GetAttrString") | py_sym(&py.utf8, "PyUnicode_AsUTF8") |
              py_sym(&py.incref, "Py_IncRef") | py_sym(&py.decref, "Py_DecRef");
    if (py_sym(&py.is_finalizing, "Py_IsFinalizing") && py_sym(&py.is_finalizing, "_Py_IsFinalizing"))
        bad = -1;
    return bad ? -1 : 1;
}

/* ---- code objects, named once ---------------------------------------------- */

typedef struct code_name {
    const PyObject *code;
    const char *file, *func;
} code_name_t;
static code_name_t *codes;
static size_t ncodes, codes_mask;

static const char *meta_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tally__meta_alloc(n);
    if (d)
        memcpy(d, s, n);
    return d ? d : "?";
}

static const char *attr_utf8(PyObject *o, const char *name)
{
    PyObject *v = py.getattr(o, name);
    const char *s = v ? py.utf8(v) : NULL;
    const char *copy = meta_strdup(s ? s : "?");
    if (v)
        py.decref(v);
    return copy;
}

static size_t ptr_slot(const void *p, size_t mask)
{
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* The names of code, when known. Under py_lock. */
static bool code_find_locked(const PyObject *code, const char **file, const char **func)
{
    if (!codes)
        return false;
    for (size_t i = ptr_slot(code, codes_mask);; i = (i + 1) & codes_mask) {
        if (codes[i].code == code) {
            *file = codes[i].file;
            *func = codes[i].func;
            return true;
        }
        if (!codes[i].code)
            return false;
    }
}

/* Remember code's names; false without memory. Under py_lock (and the GIL:
 * Py_IncRef runs no Python code). */
static bool code_add_locked(PyObject *code, const char *file, const char *func)
{
    if (!codes || (ncodes + 1) * 2 > codes_mask + 1) {
        size_t cap = codes ? (codes_mask + 1) * 2 : 256;
        code_name_t *grown = tally__meta_calloc(cap * sizeof *grown);
        if (!grown)
            return false;
        for (size_t i = 0; codes && i <= codes_mask; i++) {
            if (!codes[i].code)
                continue;
            size_t j = ptr_slot(codes[i].code, cap - 1);
            while (grown[j].code)
                j = (j + 1) & (cap - 1);
            grown[j] = codes[i];
        }
        tally__meta_free(codes);
        codes = grown;
        codes_mask = cap - 1;
    }
    size_t i = ptr_slot(code, codes_mask);
    while (codes[i].code)
        i = (i + 1) & codes_mask;
    py.incref(code); /* kept for ever: its address names it */
    codes[i] = (code_name_t){code, file, func};
    ncodes++;
    return true;
}

/* The file and function of a code object: a look-up after the first time.
 * The first time its attributes are read with no tally lock held (reading
 * them runs no Python code today, but a lock held across a call into
 * Python could deadlock with another thread waiting for the GIL). */
static void code_names(PyObject *code, const char **file, const char **func)
{
    tally__mutex_lock(&py_lock);
    bool found = code_find_locked(code, file, func);
    tally__mutex_unlock(&py_lock);
    if (found)
        return;
    const char *fi = attr_utf8(code, "co_filename"), *fn = attr_utf8(code, "co_name");
    tally__mutex_lock(&py_lock);
    if (!code_find_locked(code, file, func)) {
        code_add_locked(code, fi, fn);
        *file = fi;
        *func = fn;
    }
    tally__mutex_unlock(&py_lock);
}

/* ---- sites, stored once ------------------------------------------------------ */

#define PYSITE_BUCKETS 4096
static tally_pysite_t *pysites[PYSITE_BUCKETS];

static const tally_pysite_t *pysite_intern(const tally_pyframe_t *frames, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        h = (h ^ (uint64_t)(uintptr_t)frames[i].file) * 1099511628211ull;
        h = (h ^ (uint64_t)(uintptr_t)frames[i].func) * 1099511628211ull;
        h = (h ^ (uint64_t)frames[i].line) * 1099511628211ull;
    }
    tally_pysite_t **slot = &pysites[h % PYSITE_BUCKETS];
    for (tally_pysite_t *s = *slot; s; s = s->next)
        if (s->hash == h && s->depth == n && memcmp(s->frames, frames, (size_t)n * sizeof *frames) == 0)
            return s;
    tally_pysite_t *s = tally__meta_alloc(sizeof *s + (size_t)n * sizeof *frames);
    if (!s)
        return NULL;
    s->hash = h;
    s->depth = n;
    memcpy(s->frames, frames, (size_t)n * sizeof *frames);
    s->next = *slot;
    *slot = s;
    return s;
}

/* Frames of the machinery that starts the program, not of the program:
 * `python -m tally run`'s runner (tally/_cli.py, tally/__main__.py) and
 * runpy (`python -m`, run_path). They are left out of sites, and do not
 * count against python_stack's depth. */
static bool runner_file(const char *file)
{
    static const char *const tails[] = {"/tally/_cli.py", "/tally/__main__.py", "/runpy.py", "<frozen runpy>"};
    if (!file)
        return false;
    size_t n = strlen(file);
    for (size_t i = 0; i < sizeof tails / sizeof *tails; i++) {
        size_t t = strlen(tails[i]);
        if ((n == t || (n > t && tails[i][0] == '/')) && memcmp(file + n - t, tails[i], t) == 0)
            return true;
    }
    return false;
}

const tally_pysite_t *tally__py_capture(int depth)
{
    if (depth <= 0)
        return NULL; /* nothing to take: Python (its symbols, the GIL) is not touched */
    int st = atomic_load_explicit(&py_state, memory_order_acquire);
    if (st == 0) {
        st = py_resolve();
        atomic_store_explicit(&py_state, st, memory_order_release);
    }
    if (st < 0 || !py.is_initialized() || py.is_finalizing() || !py.this_tstate())
        return NULL;
    tally_pyframe_t frames[64];
    if (depth > 64)
        depth = 64;
    int n = 0;
    int gil = py.gil_ensure();
    /* No tally lock is held while Python is called. */
    PyObject *f = py.get_frame(); /* borrowed */
    bool owned = false;
    while (f && n < depth) {
        PyObject *code = py.frame_code(f);
        if (code) {
            tally_pyframe_t *fr = &frames[n];
            code_names(code, &fr->file, &fr->func);
            if (!runner_file(fr->file)) {
                fr->line = py.frame_line(f);
                n++;
            }
            py.decref(code);
        }
        PyObject *back = py.frame_back(f);
        if (owned)
            py.decref(f);
        f = back;
        owned = true;
    }
    if (f && owned)
        py.decref(f);
    py.gil_release(gil);
    tally__mutex_lock(&py_lock);
    const tally_pysite_t *s = n ? pysite_intern(frames, n) : NULL;
    tally__mutex_unlock(&py_lock);
    return s;
}
