/* Fuzzes the bodies of POST /work/{id}/attempts/{n}/progress, POST
 * /workers/{id}/progress and PUT /subscriptions/{name} as their handlers read
 * them: parse_json_body, then parse_progress, parse_progress_batch or
 * parse_subscription (the first byte chooses, and a subscription's shard
 * count). An accepted
 * subscription must carry a secret that signs; an accepted progress report
 * says something. */
#include "fuzz.h"

#include <jansson.h>

#include "parse.h"
#include "parse_hooks.h"
#include "whsig.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool sub = data[0] & 1;
    Err err = {0};
    json_t *body = parse_json_body((const char *)data + 1, size - 1, 32, &err);
    if (!body) {
        fuzz_check_problem(&err, 400, 400);
        return 0;
    }
    if (sub) {
        Subscription d;
        bool reset;
        int shards = data[0] & 2 ? 3 : 1; /* "after": a seq, or an event id of three shards */
        if (parse_subscription(body, "hook", shards, NULL, &d, &reset, &err) == 0) {
            FUZZ_CHECK(d.cursor.n == shards, "an accepted subscription's cursor has %d shards",
                       d.cursor.n);
            unsigned char key[WHSIG_KEY_MAX];
            size_t keylen;
            char sig[WHSIG_LEN];
            FUZZ_CHECK(whsig_key(d.secret, key, &keylen) == 0,
                       "an accepted subscription's secret gives no key");
            FUZZ_CHECK(whsig_sign(key, keylen, "msg_1", 1, "{}", 2, sig) == 0 &&
                           !strncmp(sig, "v1,", 3) && strlen(sig) == 47,
                       "an accepted secret does not sign: %s", sig);
            FUZZ_CHECK(d.kinds && d.kinds[0], "an accepted subscription has no kinds");
            subscription_clear(&d);
        } else {
            fuzz_check_problem(&err, 400, 400);
        }
    } else {
        /* The second bit: one attempt's report, or a worker's batch (at most 8). */
        bool batch = data[0] & 2;
        ProgressUpdate *u = NULL;
        size_t n = 0;
        char *worker = NULL, *instance = NULL;
        int rc = batch ? parse_progress_batch(body, 8, &u, &n, &instance, &err)
                       : parse_progress(body, "w1", "1", &u, &n, &worker, &instance, &err);
        if (rc == 0) {
            FUZZ_CHECK(n >= 1 && n <= 8 && (batch || (worker && n == 1 && u[0].attempt == 1)),
                       "an accepted progress report has %zu updates", n);
            for (size_t i = 0; i < n; i++)
                FUZZ_CHECK(u[i].work_id && u[i].attempt >= 1 &&
                               (u[i].has_fraction || u[i].message || u[i].output),
                           "an accepted progress update says nothing");
            progress_updates_free(u, n);
            free(worker);
            free(instance);
        } else {
            FUZZ_CHECK(!u && !n, "a refused progress report left updates");
            fuzz_check_problem(&err, 400, 413);
        }
    }
    json_decref(body);
    return 0;
}
