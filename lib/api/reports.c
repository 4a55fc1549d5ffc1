/* The public report entry points and the stage boundary (include/tally.h).
 * Each checks its arguments, initialises, and calls the layer that holds
 * the work: the reports (lib/report/) and the ledger's stage stack
 * (lib/ledger/stage.c). The stage boundary lives here because it reaches
 * across layers: ending a stage records it in the ledger, releases the
 * cache (release_at_stage_end) and writes the stage report. */
#include "api/api.h"

int tally_write_report(const char *path)
{
    int rc = tally__ensure_init();
    return rc ? rc : tally__write_report(path);
}

int tally_write_leaks(int flags, tally_write_fn write, void *arg)
{
    if (!write)
        return tally__fail(TALLY_EINVAL, "tally_write_leaks: write is NULL");
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    tally_out_t o;
    tally__out_init(&o, write, arg);
    tally__report_leaks(&o, (flags & TALLY_LEAKS_FULL) != 0, (flags & TALLY_LEAKS_AT_EXIT) != 0, NULL);
    tally__out_flush(&o);
    return o.failed ? -TALLY_ENOMEM : 0;
}

int tally_write_ledger(tally_write_fn write, void *arg)
{
    if (!write)
        return tally__fail(TALLY_EINVAL, "tally_write_ledger: write is NULL");
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    tally_out_t o;
    tally__out_init(&o, write, arg);
    tally__report_ledger(&o);
    tally__out_flush(&o);
    return o.failed ? -TALLY_ENOMEM : 0;
}

int tally_write_summary(int device, int abbreviated, tally_write_fn write, void *arg)
{
    if (!write)
        return tally__fail(TALLY_EINVAL, "tally_write_summary: write is NULL");
    tally_stats_t s;
    int rc = tally_get_stats(device, &s);
    if (rc < 0)
        return rc;
    rc = tally__summary_render(&s, device, abbreviated, write, arg);
    if (rc == 0 && tally__private_any()) {
        /* After PyTorch's table: the device's private tags, asleep or awake. */
        tally_out_t o;
        tally__out_init(&o, write, arg);
        tally__report_private_text(&o, device);
        tally__out_flush(&o);
        rc = o.failed ? -TALLY_ENOMEM : 0;
    }
    return rc;
}

static void discard_writer(void *arg, const char *text, size_t len)
{
    (void)arg, (void)text, (void)len;
}

int tally_stage_begin(const char *name)
{
    if (!name)
        return tally__fail(TALLY_EINVAL, "tally_stage_begin: name is NULL");
    int rc = tally__ensure_init();
    return rc ? rc : tally__stage_begin(name, tally__private_notes_mark());
}

int tally_stage_end(const char *name)
{
    if (!name)
        return tally__fail(TALLY_EINVAL, "tally_stage_end: name is NULL");
    int rc = tally__ensure_init();
    if (rc)
        return rc;
    uint64_t from = 0;
    rc = tally__stage_end(name, TALLY_OPT(stage_report) ? tally__report_stage_to_sink : NULL, &from);
    if (rc == 0) {
        /* Which private tags slept and woke during the stage. */
        tally_out_t o;
        tally__out_init(&o, TALLY_OPT(stage_report) ? tally__sink_writer : discard_writer, NULL);
        tally__private_write_notes(&o, name, from);
        tally__out_flush(&o);
    }
    return rc;
}
