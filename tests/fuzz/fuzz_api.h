/* fuzz_api (tests/fuzz/fuzz_api.c, the target's description) in four parts,
 * and what they share:
 *   fuzz_api.c     the input decoder, the table of operations and the
 *                  libFuzzer entry points (fuzz_api_expand.c includes it)
 *   api_model.c    the model, the sink, violations, the checks after each
 *                  call and the clean-up after each input
 *   api_alloc.c    the operations on blocks and the cache
 *   api_ledger.c   the operations on tags, stages, configuration and reports
 * Declarations only. */
#ifndef TALLY_FUZZ_API_H
#define TALLY_FUZZ_API_H

#include "core/internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NDEV 3
#define CAPACITY ((size_t)96 << 20)
#define MAXLIVE 256
#define MAXFREED 64
#define DEPTH 64 /* tag stack (lib/ledger/ledger.c) and stage stack (lib/ledger/stage.c) */
#define NHOLD 4 /* streams[2..5] may be held */

/* The streams the decoder picks from: NULL and five others. */
extern void *const streams[6];

typedef struct live {
    void *p;
    size_t req, size;
    int dev;
    void *stream;
} live_t;

typedef struct name {
    char s[256];
    bool null;
} name_t;

struct model {
    live_t live[MAXLIVE];
    int nlive;
    struct freed {
        void *p;
        int dev;
        long seq; /* frees on dev before it */
    } freed[MAXFREED];
    int nfreed;
    long frees[NDEV];
    char tags[DEPTH][256];
    int ntags;
    char stages[DEPTH][256];
    int nstages;
    bool held[NHOLD];
    long op;
    int opcode;
};
extern struct model M;

/* Process-wide settings and state (fuzz_api.c, api_model.c). */
extern bool trace;       /* FUZZ_API_TRACE: print each operation */
extern long last_check;  /* the call after which tally_check() last ran */
extern long inputs;      /* inputs run by this process */
extern bool utf8_strict; /* FUZZ_STRICT=1: known bugs fail too */
extern char tmpdir[256]; /* where the JSON report is written, "" if nowhere */

/* ---- the sink: counts lines; keeps the text of the current operation ---- */

struct sink {
    long lines;
    char text[16384];
    size_t len;
};
extern struct sink S;

void sink(void *arg, const char *text, size_t len);
void sink_clear(void);

/* ---- failing ------------------------------------------------------------- */

/* Print the operation and the message, then abort (a libFuzzer crash). */
__attribute__((noreturn, format(printf, 1, 2))) void violated(const char *fmt, ...);

#define REQUIRE(cond, ...)                                                                                         \
    do {                                                                                                           \
        if (!(cond))                                                                                               \
            violated(__VA_ARGS__);                                                                                 \
    } while (0)

#define RC(call, want)                                                                                             \
    do {                                                                                                           \
        int rc_ = (call);                                                                                          \
        if (rc_ != (want))                                                                                         \
            violated("%s returned %d, expected %d", #call, rc_, (want));                                          \
    } while (0)

/* One line per operation on stderr, with FUZZ_API_TRACE. */
void say(const char *fmt, ...);

/* ---- reading the input (fuzz_api.c) --------------------------------------- */

typedef struct reader {
    const unsigned char *p;
    size_t n, i;
} reader_t;

unsigned u8(reader_t *r);
/* 0..2 mostly; sometimes -1, 3 or an extreme. */
int read_device(reader_t *r);
size_t read_size(reader_t *r);
/* Allocation streams: NULL and two others; record_stream and holds use all six. */
void *read_alloc_stream(reader_t *r);
void *read_stream(reader_t *r);
/* A tag or stage name: a fixed one, raw bytes, "", NULL, or 200 or 201 bytes. */
void read_name(reader_t *r, name_t *n);

/* ---- the model and the checks (api_model.c) -------------------------------- */

int live_find(const void *p);
void forget_freed(const void *p);
/* Live block i is freed: it leaves the model and is remembered as freed. */
void model_free(int i);
tally_stats_t stats(int dev);
int64_t live_on(int dev);
const char *top_tag(void);
const char *top_stage(void);
void expect_info(const live_t *l, bool check_names, const char *tag, const char *stage);
/* After each call: tally_check() when full, the model's counts, every
 * block's info when every_block. */
void check_all(bool full, bool every_block);

/* Nothing but a report on the sink may come of a bad pointer. */
typedef struct snapshot {
    int64_t alloc[NDEV], active[NDEV], reserved[NDEV], ooms[NDEV];
} snapshot_t;
snapshot_t snap(void);
void expect_unchanged(const snapshot_t *a, const char *what);
/* A call that must fail with code and one new sink line naming fn. */
void expect_reported(int rc, int code, long lines_before, const char *fn);
/* Undo everything an input did and check that every device is empty. */
void cleanup(void);

/* The runtime keys op_configure may change, as the clean-up restores them (api_ledger.c). */
extern const char restore_conf[];

/* ---- operations (api_alloc.c, api_ledger.c) -------------------------------- */

void op_malloc(reader_t *r);
void op_free(reader_t *r);
void op_bad_pointer(reader_t *r);
void op_record(reader_t *r);
void op_hold(reader_t *r);
void op_empty_cache(reader_t *r);
void op_fraction(reader_t *r);
void op_resets(reader_t *r);
void op_fail_alloc(reader_t *r);
void op_info(reader_t *r);
void op_tag_push(reader_t *r);
void op_tag_pop(reader_t *r);
void op_stage_begin(reader_t *r);
void op_stage_end(reader_t *r);
void op_configure(reader_t *r);
void op_reports(reader_t *r);

#endif /* TALLY_FUZZ_API_H */
