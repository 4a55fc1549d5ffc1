/* tally plot, drawing (tools/cli_plot_draw.c): the plot area and the
 * writers of the SVG and of the HTML page around it. */
#ifndef TALLY_CLI_PLOT_DRAW_H
#define TALLY_CLI_PLOT_DRAW_H

#include "cli_plot.h"

enum { SVG_W = 1260, SVG_H = 660, PL = 90, PR = 960, PT = 70, PB = 590 }; /* plot area */

/* The SVG element; xml_decl for a standalone .svg file. */
void cli_plot_write_svg(FILE *f, const plot_data_t *p, const char *file, bool xml_decl);
/* The HTML page: the SVG inline, then tables of peaks by tag, of the live
 * blocks and of the stages. */
void cli_plot_write_html(FILE *f, const plot_data_t *p, const char *file);

#endif /* TALLY_CLI_PLOT_DRAW_H */
