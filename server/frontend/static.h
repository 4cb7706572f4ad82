/* static: the web dashboard. The files of dashboard/ are compiled into the
 * binary at build time (cmake/embed_dashboard.cmake generates the table) and
 * served from memory by every node: GET / is index.html, GET /dashboard/FILE
 * any file of the folder. Open routes: the page itself holds no data, its API
 * calls carry the user's token. */
#ifndef WORKD_STATIC_H
#define WORKD_STATIC_H

#include <stddef.h>

#include "http.h"

typedef struct StaticFile {
    const char *path;         /* name in dashboard/, e.g. "app.js" */
    const char *content_type; /* from the extension */
    const unsigned char *bytes;
    size_t length;
    const char *etag; /* quoted, from a hash of the content */
} StaticFile;

/* Generated (build/generated/dashboard_data.c). */
extern const StaticFile workd_static_files[];
extern const size_t workd_static_files_count;

/* The embedded file called path, or NULL. */
const StaticFile *static_find(const char *path);

/* Route handlers (api.c): GET / and GET /dashboard/:file. */
void static_index(Req *r, char *const *params);
void static_asset(Req *r, char *const *params);

#endif
