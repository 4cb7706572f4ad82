-- workd schema, version 4: storage that lasts.
--
-- * workd_parts: the log is cut into spans of the leader's clock ("parts").
--   Every event and every finished work row carries the part it was written
--   in; retention drops a part of both tables at once (never row by row).
-- * workd_events: the log, partitioned by part, still append-only.
-- * workd_open: open work (pending, running) and dead work waiting for an
--   operator. Its size follows the open work; its only index is the primary
--   key, so the updates a job's life makes (start, fail, retry) are HOT.
-- * workd_done: finished work (completed, cancelled), written once, when it
--   finishes, partitioned by part like the log.
-- The old log becomes part 0; the old workd_work is split into the two new
-- tables. Nothing is lost.

CREATE TABLE workd_parts (
    part      integer     PRIMARY KEY,
    starts_at timestamptz NOT NULL, -- the leader writes into the newest part whose start has come
    ends_at   timestamptz NOT NULL,
    first_seq bigint,               -- the first event written into it, set by that write
    first_at  timestamptz
);
INSERT INTO workd_parts (part, starts_at, ends_at, first_seq, first_at)
SELECT 0, to_timestamp(0), now(), min(seq), min(at) FROM workd_events;

-- ---- the log ----
DROP TRIGGER workd_events_no_rewrite ON workd_events;
DROP TRIGGER workd_events_no_truncate ON workd_events;
DROP TRIGGER workd_events_leader ON workd_events;
DROP INDEX workd_events_accepted_id; -- one acceptance per id: the leader keeps it (docs/architecture.md)
ALTER TABLE workd_events RENAME TO workd_events_p0;
ALTER INDEX workd_events_pkey RENAME TO workd_events_p0_pkey;
ALTER INDEX workd_events_work RENAME TO workd_events_p0_work;
ALTER TABLE workd_events_p0 ADD COLUMN part integer NOT NULL DEFAULT 0;
ALTER TABLE workd_events_p0 ADD CONSTRAINT workd_events_p0_part CHECK (part = 0);

CREATE TABLE workd_events (
    seq     bigint      NOT NULL,
    term    bigint      NOT NULL,
    at      timestamptz NOT NULL,
    type    text        NOT NULL,
    version smallint    NOT NULL,
    work_id text,
    data    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    part    integer     NOT NULL
) PARTITION BY RANGE (part);
-- Tailing the log (listeners, /results catch-up) and one work item's history.
CREATE INDEX workd_events_seq ON workd_events (seq);
CREATE INDEX workd_events_work ON workd_events (work_id, seq);
ALTER TABLE workd_events ATTACH PARTITION workd_events_p0 FOR VALUES FROM (0) TO (1);

-- ---- work ----
CREATE TABLE workd_open (
    id           text        PRIMARY KEY,
    queue        text        NOT NULL,
    priority     integer     NOT NULL,
    payload      jsonb       NOT NULL,
    status       text        NOT NULL,  -- pending, running, dead
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL,
    timeout_ms   bigint      NOT NULL,
    run_at       timestamptz,
    created_at   timestamptz NOT NULL,
    accepted_seq bigint      NOT NULL,
    started_at   timestamptz,
    finished_at  timestamptz,           -- dead: when it died
    worker_id    text,
    deadline     timestamptz,
    last_error   text,
    updated_seq  bigint      NOT NULL
) WITH (fillfactor = 70,                -- room on the page for HOT updates
        autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 5000,
        autovacuum_vacuum_cost_delay = 0);

CREATE TABLE workd_done (
    id           text        NOT NULL,
    queue        text        NOT NULL,
    priority     integer     NOT NULL,
    payload      jsonb       NOT NULL,
    status       text        NOT NULL,  -- completed, cancelled
    attempts     integer     NOT NULL,
    max_attempts integer     NOT NULL,
    timeout_ms   bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    accepted_seq bigint      NOT NULL,
    started_at   timestamptz,
    finished_at  timestamptz NOT NULL,
    worker_id    text,
    result       jsonb,
    last_error   text,
    finished_seq bigint      NOT NULL,
    part         integer     NOT NULL
) PARTITION BY RANGE (part);
CREATE INDEX workd_done_id ON workd_done (id);            -- GET /work/{id}, idempotency
CREATE INDEX workd_done_listing ON workd_done (accepted_seq); -- GET /work, newest first
CREATE TABLE workd_done_p0 PARTITION OF workd_done FOR VALUES FROM (0) TO (1);

INSERT INTO workd_open
SELECT id, queue, priority, payload, status, attempts, max_attempts, timeout_ms, run_at,
       created_at, accepted_seq, started_at, finished_at, worker_id, deadline, last_error,
       updated_seq
  FROM workd_work WHERE status IN ('pending', 'running', 'dead');
INSERT INTO workd_done
SELECT id, queue, priority, payload, status, attempts, max_attempts, timeout_ms, created_at,
       accepted_seq, started_at, finished_at, worker_id, result, last_error, updated_seq, 0
  FROM workd_work WHERE status IN ('completed', 'cancelled');
DROP TABLE workd_work;

-- ---- the rules the database keeps ----
-- Within the retention window history is append-only: no single event and no
-- finished work row can be changed or deleted. Only whole parts go.
CREATE TRIGGER workd_events_no_rewrite BEFORE UPDATE OR DELETE ON workd_events
    FOR EACH ROW EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_events_no_truncate BEFORE TRUNCATE ON workd_events
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_done_no_rewrite BEFORE UPDATE OR DELETE ON workd_done
    FOR EACH ROW EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_done_no_truncate BEFORE TRUNCATE ON workd_done
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();
-- TRUNCATE of one part bypasses its parent's statement trigger: each part gets its own.
CREATE TRIGGER workd_events_p0_no_truncate BEFORE TRUNCATE ON workd_events_p0
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_done_p0_no_truncate BEFORE TRUNCATE ON workd_done_p0
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();

-- Times as the server reads them: milliseconds since the epoch (inlined).
CREATE FUNCTION workd_epoch_ms(t timestamptz) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT (extract(epoch from t) * 1000)::bigint
$$;

-- workd_leader follows term events, as before.
CREATE OR REPLACE FUNCTION workd_project() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'term' THEN
        INSERT INTO workd_leader (id, term, url, since)
        VALUES (1, (NEW.data->>'term')::bigint, NEW.data->>'leader', NEW.at)
        ON CONFLICT (id) DO UPDATE SET term = EXCLUDED.term, url = EXCLUDED.url,
                                       since = EXCLUDED.since;
        PERFORM pg_notify('workd_leader', NEW.data->>'term');
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER workd_events_leader AFTER INSERT ON workd_events
    FOR EACH ROW WHEN (NEW.type = 'term') EXECUTE FUNCTION workd_project();

-- Adds part p (its events and finished work), covering [starts_at, ends_at).
-- Each table is made apart and then attached, which needs only a lock that
-- does not block the leader's appends (SHARE UPDATE EXCLUSIVE).
CREATE FUNCTION workd_part_add(p integer, s timestamptz, e timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['workd_events', 'workd_done'] LOOP
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS, CHECK (part = %s))',
                       t || '_p' || p, t, p);
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                       'EXECUTE FUNCTION workd_events_append_only()',
                       t || '_p' || p || '_no_truncate', t || '_p' || p);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                       t, t || '_p' || p, p, p + 1);
    END LOOP;
    INSERT INTO workd_parts (part, starts_at, ends_at) VALUES (p, s, e);
END
$$;
