/* Reports: pure functions from a statistics snapshot to text or JSON, written
 * through a caller's sink. Internal to the library. */
#ifndef TALLY_REPORT_H
#define TALLY_REPORT_H

#include "core/internal.h"

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
int tally__stats_from_json(const char *text, size_t len, tally_stats_t *out, char *err,
                           size_t errlen);

#endif /* TALLY_REPORT_H */
