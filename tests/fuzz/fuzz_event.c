/* Fuzzes event_decode with a row of the event table as the input: the type on
 * the first line, the work id on the second (no second line: SQL NULL), the
 * data column's JSON text after it (not JSON: NULL). A decoded event must
 * encode (event_data_encode) into data that decodes to the same event. */
#include "fuzz.h"

#include <jansson.h>

#include "event.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

/* Strings that an encoding writes as "" when they are NULL. */
static bool same_str(const char *a, const char *b)
{
    return !strcmp(a ? a : "", b ? b : "");
}

static bool same_json(const json_t *a, const json_t *b)
{
    return (!a && !b) || (a && b && json_equal(a, b));
}

static void check_same(const Event *a, const Event *b)
{
    const char *t = event_type_name(a->type);
    FUZZ_CHECK(a->type == b->type && a->seq == b->seq && a->term == b->term && a->at == b->at &&
                   a->version == b->version && same_str(a->work_id, b->work_id),
               "a %s event's columns changed", t);
    FUZZ_CHECK(same_str(a->queue, b->queue) && a->priority == b->priority &&
                   same_json(a->payload, b->payload) && a->run_at == b->run_at &&
                   a->timeout_ms == b->timeout_ms && a->max_attempts == b->max_attempts,
               "a %s event's work fields changed", t);
    FUZZ_CHECK(a->attempt == b->attempt && same_str(a->worker_id, b->worker_id) &&
                   a->deadline == b->deadline && same_json(a->result, b->result) &&
                   same_str(a->error, b->error) && a->retry_at == b->retry_at,
               "a %s event's attempt fields changed", t);
    FUZZ_CHECK(a->new_term == b->new_term && same_str(a->leader_url, b->leader_url),
               "a %s event's term fields changed", t);
    const QueueLimits *x = &a->limits, *y = &b->limits;
    FUZZ_CHECK(x->paused == y->paused && x->max_running == y->max_running &&
                   x->max_running_per_key == y->max_running_per_key &&
                   x->rate_limit == y->rate_limit && x->rate_period_ms == y->rate_period_ms &&
                   x->n_weights == y->n_weights,
               "a %s event's limits changed", t);
    for (size_t i = 0; i < x->n_weights; i++)
        FUZZ_CHECK(!strcmp(x->weights[i].key, y->weights[i].key) &&
                       x->weights[i].weight == y->weights[i].weight,
                   "a %s event's key weights changed", t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    char *work_id = strchr(text, '\n'), *json = NULL;
    if (work_id) {
        *work_id++ = '\0';
        json = strchr(work_id, '\n');
        if (json)
            *json++ = '\0';
        else
            work_id = NULL;
    }
    json_t *d = json ? json_loads(json, JSON_DECODE_ANY, NULL) : NULL;
    Event e;
    Err err = {0};
    if (event_decode(42, 3, 1767225600000LL, text, EVENT_VERSION, work_id, d, &e, &err) != 0) {
        FUZZ_CHECK(err.status == 500 && !strcmp(err.type, "bad-event"), "a bad event gives %d '%s'",
                   err.status, err.type);
    } else {
        FUZZ_CHECK(!strcmp(event_type_name(e.type), text), "the type '%s' decoded as '%s'", text,
                   event_type_name(e.type));
        FUZZ_CHECK(e.type == EV_TERM || e.work_id, "a %s event without a work id", text);
        json_t *enc = event_data_encode(&e);
        Event again;
        int rc = event_decode(e.seq, e.term, e.at, event_type_name(e.type), e.version, e.work_id,
                              enc, &again, &err);
        FUZZ_CHECK(rc == 0, "a %s event does not decode from its own encoding: %s", text, err.msg);
        check_same(&e, &again);
        Event copy;
        event_copy(&copy, &e);
        check_same(&e, &copy);
        event_clear(&copy);
        event_clear(&again);
        json_decref(enc);
        event_clear(&e);
    }
    json_decref(d);
    free(text);
    return 0;
}
