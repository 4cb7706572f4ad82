-- workd schema, version 12: weighted turns of keys, and activity per bucket.
--
-- * workd_queues.key_weights: a queue's key weights ({key: weight}) as its
--   last queue_set event set them; a key of weight w gets w turns in a row.
-- * workd_activity: per queue and 10-second bucket of the leader's clock, the
--   work accepted, completed, cancelled, dead and the attempts that failed,
--   added up by the leader's append in the same transaction as the events it
--   counts, so the dashboard's chart is the log's, on every node and across
--   restarts, without reading the log. The leader's retention pass deletes
--   buckets older than an hour (a few rows per queue and minute).
ALTER TABLE workd_queues ADD COLUMN key_weights jsonb; -- NULL: every key has weight 1

CREATE OR REPLACE FUNCTION workd_queue_project() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workd_queues (queue, paused, max_running, max_running_per_key, rate_limit,
                              rate_period_ms, key_weights, updated_seq, updated_at)
    VALUES (NEW.data->>'queue', (NEW.data->>'paused')::boolean,
            (NEW.data->>'max_running')::integer, (NEW.data->>'max_running_per_key')::integer,
            (NEW.data->'rate'->>'limit')::integer, (NEW.data->'rate'->>'period_ms')::bigint,
            NEW.data->'key_weights', NEW.seq, NEW.at)
    ON CONFLICT (queue) DO UPDATE
       SET paused = EXCLUDED.paused, max_running = EXCLUDED.max_running,
           max_running_per_key = EXCLUDED.max_running_per_key,
           rate_limit = EXCLUDED.rate_limit, rate_period_ms = EXCLUDED.rate_period_ms,
           key_weights = EXCLUDED.key_weights,
           updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
    RETURN NULL;
END
$$;

CREATE TABLE workd_activity (
    bucket    bigint NOT NULL,  -- the bucket's start, seconds since the epoch (a multiple of 10)
    queue     text   NOT NULL,
    accepted  bigint NOT NULL,
    completed bigint NOT NULL,
    failed    bigint NOT NULL,  -- attempts that failed or timed out
    dead      bigint NOT NULL,
    cancelled bigint NOT NULL,
    PRIMARY KEY (bucket, queue)
) WITH (fillfactor = 70);     -- each bucket's row is updated by every commit for 10 s: HOT

-- Work submitted in SQL keeps what HTTP keeps (README "What a payload keeps"):
-- a number of 2^63 or more in magnitude would come back from jsonb as an
-- integer beyond 64 bits, which the server cannot read, so workd.submit's
-- insert is refused (rows already there are not checked; the leader refuses
-- such an entry when it takes it).
ALTER TABLE workd_inbox ADD CONSTRAINT workd_inbox_payload_numbers_within_64_bits
    CHECK (NOT jsonb_path_exists(payload,
        'strict $.** ? (@.type() == "number" && (@ >= 9223372036854775808 || @ < -9223372036854775808))'))
    NOT VALID;
