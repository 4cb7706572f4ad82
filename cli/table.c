/* table: see table.h. */
#include "table.h"

#include <stdlib.h>
#include <string.h>

#include "term.h"
#include "util.h"

struct Table {
    const char *const *heads;
    size_t ncols;
    char **cells; /* rows * ncols, owned */
    size_t rows, cap;
};

Table *table_new(const char *const *heads)
{
    Table *t = xcalloc(1, sizeof *t);
    t->heads = heads;
    while (heads[t->ncols] && t->ncols < TABLE_COLS_MAX)
        t->ncols++;
    return t;
}

void table_row(Table *t, const char *const *cells)
{
    if (t->rows == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->cells = xrealloc(t->cells, t->cap * t->ncols * sizeof *t->cells);
    }
    for (size_t i = 0; i < t->ncols; i++) {
        const char *c = cells[i] ? cells[i] : "-";
        SBuf safe;
        sbuf_init(&safe);
        term_escape(&safe, c, strlen(c), TERM_LINE);
        t->cells[t->rows * t->ncols + i] = sbuf_steal(&safe);
    }
    t->rows++;
}

/* Display width of a UTF-8 string: its code points (no wide-character tables). */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80)
            w++;
    return w;
}

/* Cuts s in place to at most max code points, ending with "..." when cut. */
static void fit(char *s, bool cut)
{
    if (!cut || width(s) <= TABLE_CELL_MAX)
        return;
    size_t w = 0;
    char *p = s;
    for (; *p; p++) {
        if (((unsigned char)*p & 0xC0) != 0x80 && ++w > TABLE_CELL_MAX - 3)
            break;
    }
    strcpy(p, "...");
}

void table_print(Table *t, FILE *out, bool cut)
{
    size_t w[TABLE_COLS_MAX] = {0};
    for (size_t c = 0; c < t->ncols; c++)
        w[c] = width(t->heads[c]);
    for (size_t r = 0; r < t->rows; r++)
        for (size_t c = 0; c < t->ncols; c++) {
            char *cell = t->cells[r * t->ncols + c];
            fit(cell, cut);
            if (width(cell) > w[c])
                w[c] = width(cell);
        }
    for (size_t r = 0; t->rows && r <= t->rows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *cell = r == 0 ? t->heads[c] : t->cells[(r - 1) * t->ncols + c];
            bool last = c + 1 == t->ncols;
            fputs(cell, out);
            if (!last)
                fprintf(out, "%*s", (int)(w[c] - width(cell) + 2), "");
        }
        fputc('\n', out);
    }
    for (size_t i = 0; i < t->rows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}
