/* demo: see demo.h. */
#include "demo.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

/* Writes v in decimal to out (>= 41 bytes: 2^128 has 39 digits). */
static void u128_format(unsigned __int128 v, char *out)
{
    char tmp[41];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
}

void demo_square(const json_t *payload, ExecOutcome *out)
{
    memset(out, 0, sizeof *out);
    out->exit_code = -1;
    char text[160];
    if (json_is_integer(payload)) {
        long long n = json_integer_value(payload);
        /* |n| fits in 64 bits unsigned, its square in 128: no overflow, no rounding. */
        unsigned long long a = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;
        char sq[41];
        u128_format((unsigned __int128)a * a, sq);
        snprintf(text, sizeof text, "%lld * %lld = %s", n, n, sq);
    } else if (json_is_real(payload)) {
        double x = json_real_value(payload);
        snprintf(text, sizeof text, "%g * %g = %g", x, x, x * x);
    } else {
        exec_outcome_fail(out, false, "demo work wants a number");
        return;
    }
    exec_outcome_ok(out, json_string(text));
}

void demo_run(const json_t *payload, int64_t max_delay_ms, ExecCtl *ctl, ExecOutcome *out)
{
    int64_t start = mono_ms();
    int64_t delay = max_delay_ms > 0 ? (int64_t)(rand_unit() * (double)(max_delay_ms + 1)) : 0;
    bool stopped = false;
    if (ctl)
        stopped = exec_ctl_wait_stop(ctl, start + delay);
    else
        sleep_ms(delay);
    if (stopped) {
        memset(out, 0, sizeof *out);
        out->exit_code = -1;
        out->stopped = true;
        exec_outcome_fail(out, true, "worker stopping");
    } else {
        demo_square(payload, out);
    }
    out->elapsed_ms = mono_ms() - start;
}
