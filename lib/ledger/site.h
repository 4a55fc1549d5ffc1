/* Allocation sites: where a block was allocated, as native frames
 * (backtrace_depth) and Python frames (python_stack), interned so that equal
 * sites share one record; symbolised only when a report is written. */
#ifndef TALLY_SITE_H
#define TALLY_SITE_H

#include "ledger/ledger.h"

/* ---- symbolize.c: one native frame, named ------------------------------- */
typedef struct tally_frame_sym {
    uintptr_t pc;
    char func[256];         /* "" when unknown */
    uintptr_t func_offset;  /* pc - the function's start */
    char file[512];         /* "" without line information */
    int line;               /* 0 without line information */
    char module[512];       /* the executable or library, "" when unknown */
    uintptr_t module_offset;
    int call_line;          /* an inlined function: where it was inlined (symbolize.c) */
    uint64_t call_file;
} tally_frame_sym_t;
/* Name a return address: libdw when it loads, else dladdr. Code inlined
 * there gives several frames, innermost first (LeakSanitizer shows them
 * the same way): f[0] the inlined function, then each function it was
 * inlined into at the line of the inlined call. Fills f[0..max-1]; returns
 * how many (at least 1). */
#define TALLY_INLINE_MAX 8
int tally__symbolize(uintptr_t pc, tally_frame_sym_t *f, int max);
/* Whether libdw could be loaded (file and line information available). */
bool tally__symbolizer_has_dwarf(void);
/* "0x... in func file.c:LINE", "0x... in func+0xOFF (module+0xOFF)", "0x... in
 * func+0xOFF" (no module), "0x... in ?? (module+0xOFF)" or "0x... in ??". */
void tally__frame_format(const tally_frame_sym_t *f, char *buf, size_t len);

/* ---- pystack.c: Python frames ------------------------------------------- */
typedef struct tally_pyframe {
    const char *file, *func; /* interned, never freed */
    int line;
} tally_pyframe_t;
typedef struct tally_pysite {
    struct tally_pysite *next;
    uint64_t hash;
    int depth;
    tally_pyframe_t frames[];
} tally_pysite_t;
/* The calling thread's innermost Python frames (at most depth), interned;
 * NULL when the process has no interpreter or the thread no Python thread
 * state, and NULL at once for a depth of 0 or less (Python, its symbols and
 * the GIL untouched). Call with no tally lock held: it may wait for the GIL. */
const tally_pysite_t *tally__py_capture(int depth);

/* ---- unwind.c: native return addresses --------------------------------- */
/* Up to max return addresses of the calling thread, innermost first (the
 * first is the return into the caller of tally__unwind's caller's caller,
 * as glibc's backtrace counts); returns how many. */
int tally__unwind(void **frames, int max);
/* Whether libunwind could be loaded (unwinder:auto uses it). */
bool tally__unwind_has_libunwind(void);

/* ---- site.c: interned sites --------------------------------------------- */
struct tally_site {
    struct tally_site *next; /* hash chain */
    uint64_t hash;
    uint32_t id;
    int depth; /* native frames */
    const tally_pysite_t *py;
    void *frames[];
};
/* Capture the caller's site (native depth, Python pydepth frames; either
 * may be 0); NULL when both are off or nothing was found. */
tally_site_t *tally__site_capture(int depth, int pydepth);
uint32_t tally__site_id(const tally_site_t *site);
/* Frames of a site, one per line, each line prefixed with indent:
 * Python frames first (innermost first), then native frames. */
void tally__site_write(const tally_site_t *site, tally_out_t *o, const char *indent);
/* A one-line label: the first Python frame, else the first native frame. */
void tally__site_label(const tally_site_t *site, char *buf, size_t len);
/* The whole site as a JSON array of frames. */
void tally__site_json(const tally_site_t *site, tally_out_t *o);
/* Call fn(function, file, arg) for every frame of the site (symbolised);
 * stops and returns true as soon as fn does. */
bool tally__site_any_frame(const tally_site_t *site, bool (*fn)(const char *func, const char *file, void *arg),
                           void *arg);

/* Report lines grouped by site: sites with the most bytes first, each site's
 * "tally: WHAT N bytes (H) in K blocks allocated from:" line and frames once,
 * then line(o, item, arg) for each of its rows, largest first. Rows without a
 * site come without a heading. Sorts rows. */
typedef struct tally_site_row {
    const tally_site_t *site;
    uint64_t bytes, blocks;
    const void *item;
    uint64_t site_bytes, site_blocks; /* filled in */
} tally_site_row_t;
void tally__write_by_site(tally_out_t *o, tally_site_row_t *rows, size_t n, const char *what,
                          void (*line)(tally_out_t *o, const void *item, void *arg), void *arg);

#endif
