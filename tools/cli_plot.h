/* tally plot: memory over time from a report's timeline, stacked by tag
 * (tools/cli_plot.c rebuilds it, tools/cli_plot_draw.c draws it). */
#ifndef TALLY_CLI_PLOT_H
#define TALLY_CLI_PLOT_H

#include "cli_report.h"

#define PLOT_TAGS 9     /* tags drawn on their own; the rest are "other tags" */
#define TAG_BEFORE 0    /* "(before timeline)" */

typedef struct plot_data {
    const report_t *r;
    int device;
    bool by_events;
    size_t *ev; /* indices into r->events of this device's events, oldest first */
    size_t nev;
    double *ev_us; /* by time: each event's x (microseconds since the first, never going back) */
    /* tags: index 0 is "(before timeline)" */
    const char **tags;
    int64_t *cur, *peak, *moved; /* moved: bytes allocated plus bytes freed */
    size_t ntags, tcap;
    int *group_of; /* tag -> group */
    /* groups in stacking order, bottom first */
    const char *gname[PLOT_TAGS + 2];
    int64_t gpeak[PLOT_TAGS + 2];
    int ngroups;
    /* points */
    double *x;
    int64_t *val; /* npts x ngroups */
    int64_t *reserved;
    size_t npts;
    double x0, x_end;
    int64_t ymax, peak_alloc, peak_reserved;
    size_t nooms;
    int64_t dropped; /* older events of the device the ring had overwritten */
} plot_data_t;

/* The x of event k of the device: k, or microseconds since its first event.
 * The timeline's clock is the wall clock, which a clock step can set back:
 * an event stamped before the one ahead of it is drawn at that one's x. */
double cli_plot_event_x(const plot_data_t *p, size_t k);

/* The command, argv[0] being "plot"; returns the exit status. */
int cli_plot_main(int argc, char **argv);

#endif /* TALLY_CLI_PLOT_H */
