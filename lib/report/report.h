/* Reports: pure functions from a statistics snapshot to text or JSON, written
 * through a caller's sink. Internal to the library. */
#ifndef TALLY_REPORT_H
#define TALLY_REPORT_H

#include "ledger/stage.h"

/* text.c */
/* " (foreign: home device is H)" for a device other than the home device, else "". */
void tally__foreign_note(int device, char *buf, size_t len);
void tally__report_stage(const tally_stage_rec_t *rec, tally_out_t *o);
/* The stage report on the sink (tally__stage_end's report, with stage_report). */
void tally__report_stage_to_sink(const tally_stage_rec_t *rec);
/* The leak report: live blocks grouped by (tag, stage, device, site). full
 * lists the groups; otherwise only the summary line. Returns live bytes. */
uint64_t tally__report_leaks(tally_out_t *o, bool full, bool at_exit, uint64_t *blocks_out);
/* The ledger table and stage timeline, as text. */
void tally__report_ledger(tally_out_t *o);
/* The OOM report, under the device lock (the cache's oom hook). */
void tally__report_oom_locked(tally_device_t *d, size_t asked, size_t rounded, size_t segment, const char *why);

/* json_report.c */
int tally__report_json(tally_out_t *o);
/* tally_write_report's body, tally initialised. */
int tally__write_report(const char *path);

/* The torch.cuda.memory_summary(device, abbreviated) text for s, byte for
 * byte, through write(arg, ...). Returns 0, or a negative TALLY_E* code. */
int tally__summary_render(const tally_stats_t *s, int device, int abbreviated,
                          tally_write_fn write, void *arg);

/* Read a flat JSON object of torch.cuda.memory_stats keys (as
 * tally__stats_json writes, or json.dumps(torch.cuda.memory_stats()) gives)
 * into *out. Unknown keys are ignored and missing ones read as 0; an object
 * value under an unknown key is descended into with '.'-joined keys, so
 * memory_stats_as_nested_dict() output reads too. The fields PyTorch lacks
 * (largest_free_block, cached_free_bytes, utilisation) come out 0.
 * Returns 0, or -TALLY_EINVAL with a message in err (when err is not NULL)
 * naming the problem and its byte offset; *out is then left unchanged. */
/* How strictly: TALLY_STATS_DUMP, a torch.cuda.memory_stats() dump (keys
 * differ by PyTorch version: unknown keys are skipped unless one is a typo
 * of a known key, a family of keys is read whole or not at all, scalars may
 * be absent); TALLY_STATS_STRICT, the stats of tally's own report (every
 * key known and present). Both check that the counts add up (all = small
 * pool + large pool; current <= peak; nothing negative). */
enum { TALLY_STATS_DUMP, TALLY_STATS_STRICT };
int tally__stats_from_json_mode(const char *text, size_t len, tally_stats_t *out, int mode, char *err,
                                size_t errlen);
/* The same from an object of a parsed document (error offsets are the
 * document's). */
struct tally_json;
int tally__stats_from_node(const struct tally_json *obj, tally_stats_t *out, int mode, char *err, size_t errlen);
int tally__stats_from_json(const char *text, size_t len, tally_stats_t *out, char *err,
                           size_t errlen);

#endif /* TALLY_REPORT_H */
