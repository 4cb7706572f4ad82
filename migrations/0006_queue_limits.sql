-- workd schema, version 6: flow control. An operator's queue_set event (pause,
-- concurrency limit, rate limit) is folded here in the same transaction, so
-- that a new leader reads every queue's limits back at election (the events
-- themselves leave with their part).
CREATE TABLE workd_queues (
    queue          text        PRIMARY KEY,
    paused         boolean     NOT NULL,
    max_running    integer,    -- NULL: no limit
    rate_limit     integer,    -- starts per rate_period_ms; NULL: no limit
    rate_period_ms bigint,
    updated_seq    bigint      NOT NULL,
    updated_at     timestamptz NOT NULL
);

CREATE FUNCTION workd_queue_project() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workd_queues (queue, paused, max_running, rate_limit, rate_period_ms,
                              updated_seq, updated_at)
    VALUES (NEW.data->>'queue', (NEW.data->>'paused')::boolean,
            (NEW.data->>'max_running')::integer, (NEW.data->'rate'->>'limit')::integer,
            (NEW.data->'rate'->>'period_ms')::bigint, NEW.seq, NEW.at)
    ON CONFLICT (queue) DO UPDATE
       SET paused = EXCLUDED.paused, max_running = EXCLUDED.max_running,
           rate_limit = EXCLUDED.rate_limit, rate_period_ms = EXCLUDED.rate_period_ms,
           updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
    RETURN NULL;
END
$$;
CREATE TRIGGER workd_events_queue AFTER INSERT ON workd_events
    FOR EACH ROW WHEN (NEW.type = 'queue_set') EXECUTE FUNCTION workd_queue_project();
