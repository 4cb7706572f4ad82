/* static: see static.h. Answers point into the embedded bytes (no copy); every
 * answer says Cache-Control: no-cache with an ETag, so a browser revalidates
 * each load and an unchanged file costs a 304. */
#include "static.h"

#include <stdbool.h>
#include <string.h>

#include "err.h"

/* Strict: scripts and styles only from this origin, no inline code, API calls
 * only to this origin. The dashboard shows payloads and results, which are
 * user data; this keeps a rendering mistake from becoming script execution. */
#define STATIC_CSP                                                                                 \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "              \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const StaticFile *static_find(const char *path)
{
    for (size_t i = 0; i < workd_static_files_count; i++)
        if (!strcmp(workd_static_files[i].path, path))
            return &workd_static_files[i];
    return NULL;
}

/* If-None-Match holds "*" or a list of tags; ours is matched as a whole tag,
 * weak or not. */
static bool etag_matches(const char *inm, const char *etag)
{
    if (!inm)
        return false;
    if (!strcmp(inm, "*"))
        return true;
    size_t n = strlen(etag);
    for (const char *p = strstr(inm, etag); p; p = strstr(p + 1, etag))
        if (p[n] == '\0' || p[n] == ',' || p[n] == ' ')
            return true;
    return false;
}

static void serve(Req *r, const StaticFile *f)
{
    bool fresh = etag_matches(req_header(r, MHD_HTTP_HEADER_IF_NONE_MATCH), f->etag);
    /* The bytes are static: MHD may point at them for the connection's life. */
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        fresh ? 0 : f->length, fresh ? NULL : (void *)f->bytes, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, f->etag);
    if (!fresh) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, f->content_type);
        MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
        MHD_add_response_header(resp, "Content-Security-Policy", STATIC_CSP);
        MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    }
    /* Answered like an SSE stream: the daemon queues this response as is. */
    r->stream = resp;
    r->status = fresh ? 304 : 200;
    r->answered = true;
}

void static_index(Req *r, char *const *params)
{
    const StaticFile *f = static_find("index.html");
    if (!f) {
        Err err;
        err_set(&err, 500, "internal", "this server was built without its dashboard");
        req_finish_problem(r, &err);
        return;
    }
    serve(r, f);
}

void static_asset(Req *r, char *const *params)
{
    const StaticFile *f = static_find(params[0]);
    if (!f) {
        Err err;
        err_set(&err, 404, "not-found", "there is no dashboard file '%.100s'", params[0]);
        req_finish_problem(r, &err);
        return;
    }
    serve(r, f);
}
