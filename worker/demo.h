/* demo: the built-in demo job. It squares a number after a random delay, in
 * the calling thread (no child process). */
#ifndef WORKD_DEMO_H
#define WORKD_DEMO_H

#include <jansson.h>
#include <stdint.h>

#include "exec.h"

/* Fills *out (free with exec_outcome_free) with the demo's answer for payload:
 * for a number n the string "n * n = n²", e.g. "3 * 3 = 9" (exact for integers,
 * %g for reals); anything else fails with "demo work wants a number" and
 * retry false, since another attempt cannot do better. payload is borrowed. */
void demo_square(const json_t *payload, ExecOutcome *out);

/* Waits a random time in [0, max_delay_ms], then does demo_square(). Stopping
 * ctl (may be NULL) during the wait ends it at once as a stopped outcome. */
void demo_run(const json_t *payload, int64_t max_delay_ms, ExecCtl *ctl, ExecOutcome *out);

#endif
