-- workd schema, version 7: fair sharing. Work may carry a key (a tenant, a
-- customer, an API account); a queue hands out work of different keys in
-- turn, and may limit the attempts of one key running at once.
ALTER TABLE workd_open ADD COLUMN key text;
ALTER TABLE workd_done ADD COLUMN key text;
ALTER TABLE workd_queues ADD COLUMN max_running_per_key integer; -- NULL: no limit

CREATE OR REPLACE FUNCTION workd_queue_project() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workd_queues (queue, paused, max_running, max_running_per_key, rate_limit,
                              rate_period_ms, updated_seq, updated_at)
    VALUES (NEW.data->>'queue', (NEW.data->>'paused')::boolean,
            (NEW.data->>'max_running')::integer, (NEW.data->>'max_running_per_key')::integer,
            (NEW.data->'rate'->>'limit')::integer, (NEW.data->'rate'->>'period_ms')::bigint,
            NEW.seq, NEW.at)
    ON CONFLICT (queue) DO UPDATE
       SET paused = EXCLUDED.paused, max_running = EXCLUDED.max_running,
           max_running_per_key = EXCLUDED.max_running_per_key,
           rate_limit = EXCLUDED.rate_limit, rate_period_ms = EXCLUDED.rate_period_ms,
           updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
    RETURN NULL;
END
$$;
