/* table: rows of text printed in aligned columns, for people. On a terminal a
 * long cell is cut to TABLE_CELL_MAX characters; into a pipe or a file every
 * cell is printed whole. */
#ifndef WORKD_CLI_TABLE_H
#define WORKD_CLI_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define TABLE_COLS_MAX 12
#define TABLE_CELL_MAX 60

typedef struct Table Table;

/* A table with the given column heads (NULL-terminated, at most
 * TABLE_COLS_MAX; the strings are borrowed and must outlive the table). */
Table *table_new(const char *const *heads);
/* Adds a row of as many cells as heads; each cell is copied (NULL prints "-"),
 * escaped for a terminal on one line (term.h: a newline in a result shows as
 * \n, an ESC as \x1b). */
void table_row(Table *t, const char *const *cells);
/* Prints the heads and the rows (nothing when there is no row), then frees the
 * table. cut: shorten long cells (the caller passes whether out is a terminal). */
void table_print(Table *t, FILE *out, bool cut);

#endif
