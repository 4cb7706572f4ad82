/* leaderinfo: what this node knows of each shard's leader (its advertise URL
 * and term).
 * One writer, the listener, which reads it from the database; anyone reads it.
 * A reader that found the leader unreachable marks it suspect, and the
 * listener re-reads it soon. Thread-safe: a mutex guards the URL and term. */
#ifndef WORKD_LEADERINFO_H
#define WORKD_LEADERINFO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shard.h"

typedef struct LeaderInfo LeaderInfo;

/* ---- lifetime ---- */
/* For a cluster of `shards` shards; nothing known yet: URL "", term 0. */
LeaderInfo *leaderinfo_new(int shards);
void leaderinfo_free(LeaderInfo *li);

/* ---- the writer (the listener thread) ---- */
/* Records a shard's leader as read from the database and clears the
 * suspicion. Returns whether the URL or term changed. */
bool leaderinfo_set(LeaderInfo *li, int shard, const char *url, int64_t term);

/* ---- readers (any thread) ---- */
/* How many shards it knows of (1 for NULL). */
int leaderinfo_shards(const LeaderInfo *li);
/* Copies a shard's leader URL into out ("" if unknown); returns the term. */
int64_t leaderinfo_get(LeaderInfo *li, int shard, char *out, size_t outlen);
/* A forward to a leader failed, or none is known: ask the writer to re-read
 * them all. */
void leaderinfo_mark_suspect(LeaderInfo *li);
/* Whether a reader asked for a re-read since the last leaderinfo_set. */
bool leaderinfo_suspect(LeaderInfo *li);

#endif
