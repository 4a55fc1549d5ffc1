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
#include "site.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The libdw entry points used, declared here (libdw's headers are not
 * needed to build): opaque handles, and its callback table's layout. */
typedef struct Dwfl Dwfl;
typedef struct Dwfl_Module Dwfl_Module;
typedef struct Dwfl_Line Dwfl_Line;
typedef int (*dw_cb_fn)(void);
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

/* Fill f from libdw; 0 when the address lies in a known module. */
static int dw_lookup(uintptr_t pc, tally_frame_sym_t *f)
{
    uint64_t a = pc - 1; /* a return address: look up the call itself */
    Dwfl_Module *m = dw.addrmodule(dw.dwfl, a);
    if (!m) {
        if (dw_refresh() != 0 || !(m = dw.addrmodule(dw.dwfl, a)))
            return -1;
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
    Dwfl_Line *line = dw.getsrc(m, a);
    int lineno = 0;
    const char *file = line ? dw.lineinfo(line, NULL, &lineno, NULL, NULL, NULL) : NULL;
    if (file && lineno > 0) {
        snprintf(f->file, sizeof f->file, "%s", file);
        f->line = lineno;
    }
    return 0;
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

void tally__symbolize(uintptr_t pc, tally_frame_sym_t *f)
{
    memset(f, 0, sizeof *f);
    f->pc = pc;
    tally__mutex_lock(&sym_lock);
    if (dw.state == 0)
        dw.state = dw_load() == 0 ? 1 : -1;
    int found = dw.state == 1 && dw_lookup(pc, f) == 0;
    tally__mutex_unlock(&sym_lock);
    if (!found || !f->func[0])
        dladdr_lookup(pc, f);
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
    else if (f->module[0])
        snprintf(buf, len, "0x%012llx in ?? (%s+0x%llx)", (unsigned long long)f->pc, base_name(f->module),
                 (unsigned long long)f->module_offset);
    else
        snprintf(buf, len, "0x%012llx in ??", (unsigned long long)f->pc);
}
