/* Helpers of the `tally plot` tests (test_cli_plot, test_cli_plot_hand):
 * reading back the SVG a plot wrote. Include after cliutil.h. */
#ifndef TALLY_TESTS_PLOTUTIL_H
#define TALLY_TESTS_PLOTUTIL_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 0 when path parses as XML (python3's minidom, else xmllint); 77 when
 * neither is available. */
static int xml_check(const char *path)
{
    char cmd[PATH_MAX + 200];
    if (system("python3 -c 'import xml.dom.minidom' >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd,
                 "python3 -c \"import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])\" '%s'", path);
        return system(cmd) == 0 ? 0 : 1;
    }
    if (system("xmllint --version >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
        return system(cmd) == 0 ? 0 : 1;
    }
    return 77;
}

static size_t count(const char *s, const char *sub)
{
    size_t n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}


/* The plot at path (an SVG file), and in *zero_y the y of memory 0: the
 * first grid line's. */
static char *slurp_plot(const char *path, double *zero_y)
{
    char *svg = slurp(path);
    assert_non_null(svg);
    const char *grid = strstr(svg, "<g class=\"grid\"");
    assert_non_null(grid);
    const char *y1 = strstr(grid, " y1=\"");
    assert_non_null(y1);
    assert_int_equal(sscanf(y1 + 5, "%lf", zero_y), 1);
    return svg;
}
/* The points of an SVG path "M x,y L x,y ...". */
typedef struct {
    double x[8192], y[8192];
    int n;
} pts_t;

static void read_pts(const char *d, pts_t *p)
{
    int used = 0;
    p->n = 0;
    while (p->n < 8192 && sscanf(d, " %*[ML]%lf,%lf%n", &p->x[p->n], &p->y[p->n], &used) == 2) {
        p->n++;
        d += used;
    }
}
#endif
