/* Fuzzes the framing check of a request's head (head_line, head_check): the
 * input's first byte picks HTTP/1.0 or 1.1, its lines are header lines
 * "name:value" as libmicrohttpd keeps them. An accepted head must have one
 * way to read it. */
#include "fuzz.h"

#include <strings.h>

#include "head.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

/* Whether v is "chunked" with optional spaces and tabs around it, any case. */
static bool chunked(const char *v)
{
    v += strspn(v, " \t");
    if (strncasecmp(v, "chunked", 7) != 0)
        return false;
    return v[7 + strspn(v + 7, " \t")] == '\0';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    bool http11 = data[0] & 1;
    char *text = fuzz_cstr(data + 1, size - 1);
    HeadCheck h = {0};
    int hosts = 0, lengths = 0, encodings = 0;
    const char *encoding = NULL;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue; /* libmicrohttpd refuses a line without a colon itself */
        *colon = '\0';
        char *value = colon + 1;
        value += strspn(value, " \t");
        head_line(&h, line, strlen(line), value, strlen(value));
        hosts += !strcasecmp(line, "Host");
        lengths += !strcasecmp(line, "Content-Length");
        if (!strcasecmp(line, "Transfer-Encoding")) {
            encodings++;
            encoding = value;
        }
    }
    Err err = {0};
    if (head_check(&h, http11, &err) != 0) {
        fuzz_check_problem(&err, 400, 501);
    } else {
        FUZZ_CHECK(hosts <= 1 && (!http11 || hosts == 1), "%d Host lines were accepted", hosts);
        FUZZ_CHECK(lengths <= 1, "%d Content-Length lines were accepted", lengths);
        FUZZ_CHECK(!(lengths && encodings), "Content-Length and Transfer-Encoding were accepted");
        FUZZ_CHECK(encodings == 0 || (http11 && encodings == 1 && chunked(encoding)),
                   "Transfer-Encoding '%s' (%d lines) was accepted", encoding ? encoding : "",
                   encodings);
    }
    free(text);
    return 0;
}
