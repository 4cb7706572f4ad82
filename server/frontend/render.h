/* render: the API's JSON, written from the store's typed reads (view.h), one
 * function per type, as redis's addReply* write typed values straight to the
 * reply. Nothing here reads a tree back: payloads, results, progress output
 * and event data are the only JSON that comes in, and go out as they are.
 * Every function returns a new reference and only reads its argument. */
#ifndef WORKD_RENDER_H
#define WORKD_RENDER_H

#include <jansson.h>

#include "view.h"

/* ---- work ---- */
/* GET /work/{id}: the Work schema of openapi.yaml. */
json_t *render_work(const WorkView *w);
/* GET /work/{id}/events: {id, events, next_after}. */
json_t *render_work_events(const WorkEvents *e);
/* GET /work: {items, next_before}. */
json_t *render_work_list(const WorkList *l);

#endif
