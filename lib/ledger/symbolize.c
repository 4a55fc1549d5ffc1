/* Native frames to names, only when a report is written (never on the
 * allocation path). With elfutils' libdw (libdw.so.1, loaded with dlopen the
 * first time a report needs it, so libtally.so does not depend on it): the
 * function from the symbol table and the source file and line from the
 * DWARF line table, debug files found the standard way (build-id, debuglink,
 * /usr/lib/debug). Without libdw, or for a module without debug
 * information: dladdr's exported symbol and offset, and the module.
 *
 * One libdw session serves every report; it is refreshed when an address
 * falls outside the modules it knows (a library loaded since). libdw is not
 * thread-safe, so a mutex guards it. */
#include "ledger/site.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The libdw entry points used, declared here (libdw's headers are not
 * needed to build): opaque handles, and its callback table's layout. */
typedef struct Dwfl Dwfl;
typedef struct Dwfl_Module Dwfl_Module;
typedef struct Dwfl_Line Dwfl_Line;
typedef int (*dw_cb_fn)(void);
/* libdw's public Dwarf_Die and Dwarf_Attribute (libdw.h), by layout. */
typedef struct {
    void *addr, *cu, *abbrev;
    long padding;
} dw_die_t;
typedef struct {
    unsigned int code, form;
    unsigned char *valp;
    void *cu;
} dw_attr_t;
enum { DW_TAG_INLINED = 0x1d, DW_TAG_SUBPROGRAM = 0x2e, DW_AT_NAME = 0x03, DW_AT_CALL_FILE = 0x58,
       DW_AT_CALL_LINE = 0x59 };
typedef struct {
    dw_cb_fn find_elf, find_debuginfo, section_address;
    char **debuginfo_path;
} dw_callbacks_t;

static struct {
    Dwfl *(*begin)(const dw_callbacks_t *);
    void (*report_begin)(Dwfl *);
    int (*proc_report)(Dwfl *, pid_t);
    int (*report_end)(Dwfl *, void *, void *);
    Dwfl_Module *(*addrmodule)(Dwfl *, uint64_t);
    const char *(*addrinfo)(Dwfl_Module *, uint64_t, uint64_t *, Elf64_Sym *, uint32_t *, void **, uint64_t *);
    Dwfl_Line *(*getsrc)(Dwfl_Module *, uint64_t);
    const char *(*lineinfo)(Dwfl_Line *, uint64_t *, int *, int *, uint64_t *, uint64_t *);
    const char *(*module_info)(Dwfl_Module *, void ***, uint64_t *, uint64_t *, uint64_t *, uint64_t *,
                               const char **, const char **);
    /* Optional: the innermost (perhaps inlined) function's name. */
    dw_die_t *(*addrdie)(Dwfl_Module *, uint64_t, uint64_t *);
    int (*getscopes)(dw_die_t *, uint64_t, dw_die_t **);
    int (*getscopes_die)(dw_die_t *, dw_die_t **);
    int (*tag)(dw_die_t *);
    dw_attr_t *(*attr_integrate)(dw_die_t *, unsigned int, dw_attr_t *);
    const char *(*formstring)(dw_attr_t *);
    int (*formudata)(dw_attr_t *, uint64_t *);
    int (*getsrcfiles)(dw_die_t *, void **, size_t *);
    const char *(*filesrc)(void *, size_t, uint64_t *, uint64_t *);
    dw_callbacks_t cb;
    char *debug_path;
    Dwfl *dwfl;
    int state; /* 0 not tried, 1 loaded, -1 unavailable */
} dw;

static tally_mutex_t sym_lock = TALLY_MUTEX_INIT;

#define DW_SYM(field, name)                                                                                    \
    do {                                                                                                       \
        void *p_ = dlsym(h, name);                                                                             \
        if (!p_)                                                                                               \
            return -1;                                                                                         \
        memcpy(&dw.field, &p_, sizeof p_);                                                                     \
    } while (0)

static int dw_refresh(void);

/* An entry point that may be missing: 0 when found. */
static int opt_sym(void *h, const char *name, void *field)
{
    void *p = dlsym(h, name);
    if (p)
        memcpy(field, &p, sizeof p);
    return p ? 0 : -1;
}

static int dw_load(void)
{
    void *h = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    DW_SYM(begin, "dwfl_begin");
    DW_SYM(report_begin, "dwfl_report_begin");
    DW_SYM(proc_report, "dwfl_linux_proc_report");
    DW_SYM(report_end, "dwfl_report_end");
    DW_SYM(addrmodule, "dwfl_addrmodule");
    DW_SYM(addrinfo, "dwfl_module_addrinfo");
    DW_SYM(getsrc, "dwfl_module_getsrc");
    DW_SYM(lineinfo, "dwfl_lineinfo");
    DW_SYM(module_info, "dwfl_module_info");
    DW_SYM(cb.find_elf, "dwfl_linux_proc_find_elf");
    DW_SYM(cb.find_debuginfo, "dwfl_standard_find_debuginfo");
    if (opt_sym(h, "dwfl_module_addrdie", &dw.addrdie) || opt_sym(h, "dwarf_getscopes", &dw.getscopes) ||
        opt_sym(h, "dwarf_getscopes_die", &dw.getscopes_die) ||
        opt_sym(h, "dwarf_tag", &dw.tag) || opt_sym(h, "dwarf_attr_integrate", &dw.attr_integrate) ||
        opt_sym(h, "dwarf_formstring", &dw.formstring) || opt_sym(h, "dwarf_formudata", &dw.formudata) ||
        opt_sym(h, "dwarf_getsrcfiles", &dw.getsrcfiles) || opt_sym(h, "dwarf_filesrc", &dw.filesrc))
        dw.addrdie = NULL; /* no inlined names: the symbol table's */
    dw.cb.debuginfo_path = &dw.debug_path; /* NULL: libdw's default search path */
    dw.dwfl = dw.begin(&dw.cb);
    if (!dw.dwfl)
        return -1;
    return dw_refresh();
}

/* Report the process's current modules to the session. */
static int dw_refresh(void)
{
    dw.report_begin(dw.dwfl);
    if (dw.proc_report(dw.dwfl, getpid()) != 0)
        return -1;
    return dw.report_end(dw.dwfl, NULL, NULL) == 0 ? 0 : -1;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static const char *die_string(dw_die_t *die, unsigned int at)
{
    dw_attr_t attr;
    return dw.attr_integrate(die, at, &attr) ? dw.formstring(&attr) : NULL;
}

static uint64_t die_number(dw_die_t *die, unsigned int at)
{
    dw_attr_t attr;
    uint64_t v = 0;
    if (!dw.attr_integrate(die, at, &attr) || dw.formudata(&attr, &v) != 0)
        return 0;
    return v;
}

/* Functions inlined at a: f[0] (filled from the symbol and line tables)
 * becomes the innermost inlined function, and f[1..] the functions it was
 * inlined into, each at the line of its inlined call, out to the real
 * function. Returns the number of frames (1 when nothing was inlined). */
static int dw_inlined(Dwfl_Module *m, uint64_t a, tally_frame_sym_t *f, int max)
{
    uint64_t bias = 0;
    dw_die_t *cu = dw.addrdie ? dw.addrdie(m, a, &bias) : NULL;
    dw_die_t *inner = NULL, *scopes = NULL;
    /* The scopes at a end at the first inlined instance's abstract
     * definition; the scopes around that innermost DIE itself give the
     * concrete chain of functions it was inlined into. */
    int nscopes = cu ? dw.getscopes(cu, a - bias, &inner) : 0;
    nscopes = nscopes > 0 ? dw.getscopes_die(&inner[0], &scopes) : 0;
    void *files = NULL;
    size_t nfiles = 0;
    if (nscopes > 0 && dw.getsrcfiles(cu, &files, &nfiles) != 0)
        files = NULL;
    int n = 0;
    for (int i = 0; i < nscopes && n < max; i++) {
        int tag = dw.tag(&scopes[i]);
        if (tag != DW_TAG_INLINED && tag != DW_TAG_SUBPROGRAM)
            continue;
        if (n > 0) { /* the caller of the previous one: same pc and module */
            f[n] = f[0];
            f[n].file[0] = 0;
            f[n].line = 0;
        }
        const char *name = die_string(&scopes[i], DW_AT_NAME);
        if (name && *name) {
            snprintf(f[n].func, sizeof f[n].func, "%s", name);
            f[n].func_offset = 0;
        }
        if (n > 0) {
            /* The line of the call that inlined frame n-1. */
            f[n].line = f[n - 1].call_line;
            uint64_t fi = f[n - 1].call_file;
            const char *file = files && fi < nfiles ? dw.filesrc(files, fi, NULL, NULL) : NULL;
            snprintf(f[n].file, sizeof f[n].file, "%s", file && f[n].line ? file : "");
            if (!f[n].file[0])
                f[n].line = 0;
        }
        f[n].call_line = tag == DW_TAG_INLINED ? (int)die_number(&scopes[i], DW_AT_CALL_LINE) : 0;
        f[n].call_file = tag == DW_TAG_INLINED ? die_number(&scopes[i], DW_AT_CALL_FILE) : 0;
        n++;
        if (tag == DW_TAG_SUBPROGRAM)
            break;
    }
    free(inner);
    free(scopes);
    return n ? n : 1;
}

static bool is_c_library(const char *module)
{
    const char *b = strrchr(module, '/') ? strrchr(module, '/') + 1 : module;
    return strncmp(b, "libc.so", 7) == 0 || strncmp(b, "ld-linux", 8) == 0 || strncmp(b, "libpthread.so", 13) == 0;
}

/* The session's module that holds address a, or NULL. dwfl_addrmodule's
 * answer is checked against the module's own bounds: elfutils 0.188 can
 * answer with the module below a gap for an address in that gap. A library
 * loaded since the last report into the gap above libdw's own mapping came
 * back as libdw, with no line for the address (1 run in 12 under TSan, whose
 * address-space layout puts libraries there), so the caller refreshed
 * nothing and printed no file and line. */
static Dwfl_Module *dw_module_at(uint64_t a)
{
    Dwfl_Module *m = dw.addrmodule(dw.dwfl, a);
    uint64_t lo = 0, hi = 0;
    if (!m || !dw.module_info(m, NULL, &lo, &hi, NULL, NULL, NULL, NULL))
        return NULL;
    return a >= lo && a < hi ? m : NULL;
}

/* Fill f[0..] from libdw; the number of frames, 0 when the address lies in
 * no known module. */
static int dw_lookup(uintptr_t pc, tally_frame_sym_t *f, int max)
{
    uint64_t a = pc - 1; /* a return address: look up the call itself */
    Dwfl_Module *m = dw_module_at(a);
    if (!m) {
        if (dw_refresh() != 0 || !(m = dw_module_at(a)))
            return 0;
    }
    uint64_t start = 0;
    const char *mod = dw.module_info(m, NULL, &start, NULL, NULL, NULL, NULL, NULL);
    if (mod) {
        snprintf(f->module, sizeof f->module, "%s", mod);
        f->module_offset = pc - (uintptr_t)start;
    }
    uint64_t off = 0;
    Elf64_Sym sym;
    const char *name = dw.addrinfo(m, a, &off, &sym, NULL, NULL, NULL);
    if (name && *name) {
        snprintf(f->func, sizeof f->func, "%s", name);
        f->func[strcspn(f->func, "@")] = 0; /* no symbol version (@@GLIBC_2.34) */
        f->func_offset = (uintptr_t)off + 1;
    }
    /* The C library's own frames (start-up, thread start) keep the function
     * from its symbol table but get no file and line: its source paths
     * (../sysdeps/nptl/...) name glibc's build tree, and reading its line
     * table, where libc6-dbg is installed, cost the first report 50 to 130 ms
     * (the gap the plot showed); the rest of a 4-frame site took 1 ms. */
    if (mod && is_c_library(mod))
        return 1;
    Dwfl_Line *line = dw.getsrc(m, a);
    int lineno = 0;
    const char *file = line ? dw.lineinfo(line, NULL, &lineno, NULL, NULL, NULL) : NULL;
    if (!file || lineno <= 0)
        return 1;
    snprintf(f->file, sizeof f->file, "%s", file);
    f->line = lineno;
    /* The line may be in inlined code: one frame per inlined function. */
    return dw_inlined(m, a, f, max);
}

static void dladdr_lookup(uintptr_t pc, tally_frame_sym_t *f)
{
    Dl_info info;
    if (!dladdr((void *)(pc - 1), &info))
        return;
    if (info.dli_fname) {
        snprintf(f->module, sizeof f->module, "%s", info.dli_fname);
        f->module_offset = pc - (uintptr_t)info.dli_fbase;
    }
    if (info.dli_sname && !f->func[0]) {
        snprintf(f->func, sizeof f->func, "%s", info.dli_sname);
        f->func_offset = pc - (uintptr_t)info.dli_saddr;
    }
}

int tally__symbolize(uintptr_t pc, tally_frame_sym_t *f, int max)
{
    memset(f, 0, sizeof *f);
    f->pc = pc;
    tally__mutex_lock(&sym_lock);
    if (dw.state == 0)
        dw.state = dw_load() == 0 ? 1 : -1;
    int n = dw.state == 1 ? dw_lookup(pc, f, max) : 0;
    tally__mutex_unlock(&sym_lock);
    if (!n || !f->func[0])
        dladdr_lookup(pc, f);
    return n ? n : 1;
}

bool tally__symbolizer_has_dwarf(void)
{
    tally__mutex_lock(&sym_lock);
    if (dw.state == 0)
        dw.state = dw_load() == 0 ? 1 : -1;
    bool ok = dw.state == 1;
    tally__mutex_unlock(&sym_lock);
    return ok;
}

void tally__frame_format(const tally_frame_sym_t *f, char *buf, size_t len)
{
    const char *func = f->func[0] ? f->func : "??";
    if (f->line > 0)
        snprintf(buf, len, "0x%012llx in %s %s:%d", (unsigned long long)f->pc, func, f->file, f->line);
    else if (f->func[0] && f->module[0])
        snprintf(buf, len, "0x%012llx in %s+0x%llx (%s+0x%llx)", (unsigned long long)f->pc, func,
                 (unsigned long long)f->func_offset, base_name(f->module), (unsigned long long)f->module_offset);
    else if (f->func[0])
        snprintf(buf, len, "0x%012llx in %s+0x%llx", (unsigned long long)f->pc, func,
                 (unsigned long long)f->func_offset);
    else if (f->module[0])
        snprintf(buf, len, "0x%012llx in ?? (%s+0x%llx)", (unsigned long long)f->pc, base_name(f->module),
                 (unsigned long long)f->module_offset);
    else
        snprintf(buf, len, "0x%012llx in ??", (unsigned long long)f->pc);
}
