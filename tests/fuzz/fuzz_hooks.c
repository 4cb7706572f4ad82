/* Fuzzes the bodies of POST /work/{id}/attempts/{n}/progress and PUT
 * /subscriptions/{name} as their handlers read them: parse_json_body, then
 * parse_progress or parse_subscription (the first byte chooses). An accepted
 * subscription must carry a secret that signs; an accepted progress report
 * says something. */
#include "fuzz.h"

#include <jansson.h>

#include "parse.h"
#include "parse_hooks.h"
#include "webhooks.h"

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
        json_t *d = NULL;
        if (parse_subscription(body, "hook", &d, &err) == 0) {
            unsigned char key[WEBHOOKS_KEY_MAX];
            size_t keylen;
            char sig[WEBHOOKS_SIG_LEN];
            FUZZ_CHECK(webhooks_secret_key(json_string_value(json_object_get(d, "secret")), key,
                                           &keylen) == 0,
                       "an accepted subscription's secret gives no key");
            FUZZ_CHECK(webhooks_sign(key, keylen, "msg_1", 1, "{}", 2, sig) == 0 &&
                           !strncmp(sig, "v1,", 3) && strlen(sig) == 47,
                       "an accepted secret does not sign: %s", sig);
            FUZZ_CHECK(json_array_size(json_object_get(d, "kinds")) >= 1,
                       "an accepted subscription has no kinds");
            json_decref(d);
        } else {
            fuzz_check_problem(&err, 400, 400);
        }
    } else {
        int attempt;
        char *worker = NULL, *instance = NULL;
        json_t *d = NULL;
        if (parse_progress(body, "1", &attempt, &worker, &instance, &d, &err) == 0) {
            FUZZ_CHECK(json_object_size(d) >= 1, "an accepted progress report says nothing");
            FUZZ_CHECK(worker && attempt == 1, "an accepted progress report lost its worker");
            json_decref(d);
            free(worker);
            free(instance);
        } else {
            fuzz_check_problem(&err, 400, 400);
        }
    }
    json_decref(body);
    return 0;
}
