/* tally tune --plot: reserved memory over the trace (x: event number) for
 * a few replays, as step lines in one SVG. The report plot (cli_plot.h)
 * stacks a report's timeline by tag; this one only compares whole-device
 * totals, so it is drawn here in a few lines instead. */
#include "tune.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

int tune_plot_svg(const char *path, const char *title, const tune_series_t *s, const char *const *names, size_t n,
                  char *err, size_t errlen)
{
    static const char *const colors[] = {"#e15759", "#4e79a7", "#59a14f", "#f28e2c"};
    const double W = 900, H = 420, L = 80, R = 20, T = 40, B = 50;
    int64_t top = 1;
    size_t len = 1;
    for (size_t k = 0; k < n; k++) {
        len = s[k].n > len ? s[k].n : len;
        for (size_t i = 0; i < s[k].n; i++)
            top = s[k].reserved[i] > top ? s[k].reserved[i] : top;
    }
    FILE *f = fopen(path, "w");
    if (!f)
        return snprintf(err, errlen, "%s: cannot write: %s", path, strerror(errno)), -1;
    double ymax = (double)top / 1048576.0 * 1.05;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"14\">reserved memory (MiB) over the trace: ", L);
    xml_text(f, title);
    fputs("</text>\n", f);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (int g = 0; g <= 4; g++) {
        double v = ymax * g / 4, y = H - B - (H - T - B) * g / 4;
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 6, y + 4, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%zu</text>\n", L + (W - L - R) * g / 4,
                H - B + 18, (size_t)((double)len * g / 4));
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">event</text>\n", L + (W - L - R) / 2, H - 8);
    for (size_t k = 0; k < n; k++) {
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" d=\"", colors[k % 4]);
        double prev_y = -1;
        for (size_t i = 0; i < s[k].n; i++) {
            double x = L + (W - L - R) * (double)i / (double)len;
            double y = H - B - (H - T - B) * ((double)s[k].reserved[i] / 1048576.0) / ymax;
            if (i == 0)
                fprintf(f, "M%.1f %.1f", x, y);
            else if (y != prev_y)
                fprintf(f, "H%.1fV%.1f", x, y);
            prev_y = y;
        }
        fprintf(f, "H%.1f\"/>\n", W - R);
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"%s\">", L + 10, T + 16 + 16.0 * (double)k, colors[k % 4]);
        xml_text(f, names[k]);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
    if (fclose(f))
        return snprintf(err, errlen, "%s: write failed", path), -1;
    return 0;
}
