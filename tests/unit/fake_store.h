/* fake_store: the store, the election and the leader's other threads as the
 * manager sees them, in memory, with faults a test sets (fake_store.c). */
#ifndef WORKD_FAKE_STORE_H
#define WORKD_FAKE_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "event.h"

/* What an append comes to. */
typedef enum {
    FAKE_OK,      /* committed */
    FAKE_REFUSED, /* the database refused it for what it holds (database-refused) */
    FAKE_LOST,    /* the session was terminated before it committed */
} FakeOutcome;

typedef struct FakeStats {
    size_t sent, committed, refused, closed;
} FakeStats;

/* Forgets everything: no log, no session, no script, commits not held. */
void fake_reset(void);
/* The outcomes of the next n appends sent, in order (then FAKE_OK). */
void fake_script(const FakeOutcome *outcomes, size_t n);
/* While held, no append out gets its outcome: the manager keeps them out and
 * a round that must land one waits. */
void fake_hold(bool hold);
/* While true, every election is lost (another node leads). */
void fake_standby(bool standby);
size_t fake_appends_out(void);
FakeStats fake_stats(void);
/* Whether the committed log holds an event of this type for work_id. */
bool fake_committed(EventType type, const char *work_id);
/* Whether workd_subscriptions holds name with this secret, paused or not. */
bool fake_subscription_is(const char *name, const char *secret, bool paused);

#endif
