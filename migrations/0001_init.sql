-- workd schema, version 1: the append-only event log, the projection of work
-- that is derived from it in the same transaction, and the current leader.

-- Every change of work state, in commit order. Only the leader appends, through
-- the session that holds the leader lock, so seq order is commit order.
CREATE TABLE workd_events (
    seq     bigint      PRIMARY KEY,
    term    bigint      NOT NULL,
    at      timestamptz NOT NULL,
    type    text        NOT NULL,
    version smallint    NOT NULL,
    work_id text,
    data    jsonb       NOT NULL DEFAULT '{}'::jsonb
);
-- One acceptance per id, ever: idempotency holds for finished work too.
CREATE UNIQUE INDEX workd_events_accepted_id ON workd_events (work_id) WHERE type = 'accepted';
CREATE INDEX workd_events_work ON workd_events (work_id, seq);

-- The database itself refuses to rewrite history.
CREATE FUNCTION workd_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'workd_events is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER workd_events_no_rewrite BEFORE UPDATE OR DELETE ON workd_events
    FOR EACH ROW EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_events_no_truncate BEFORE TRUNCATE ON workd_events
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();

-- One row per work item, kept by the trigger below in the same transaction as
-- the event. Reads (GET /work/{id}) and recovery (open work only) use it, so
-- a new leader's start-up depends on the open work, not on the history.
-- "scheduled" is not stored: it is pending with run_at in the future.
CREATE TABLE workd_work (
    id           text        PRIMARY KEY,
    queue        text        NOT NULL,
    priority     integer     NOT NULL,
    payload      jsonb       NOT NULL,
    status       text        NOT NULL,  -- pending, running, completed, dead, cancelled
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer     NOT NULL,
    timeout_ms   bigint      NOT NULL,
    run_at       timestamptz,
    created_at   timestamptz NOT NULL,
    accepted_seq bigint      NOT NULL,
    started_at   timestamptz,
    finished_at  timestamptz,
    worker_id    text,
    deadline     timestamptz,
    result       jsonb,
    last_error   text,
    updated_seq  bigint      NOT NULL
);
CREATE INDEX workd_work_open ON workd_work (accepted_seq)
    WHERE status IN ('pending', 'running');

-- The current leader, for front-ends that need to forward to it.
CREATE TABLE workd_leader (
    id    integer     PRIMARY KEY CHECK (id = 1),
    term  bigint      NOT NULL,
    url   text        NOT NULL,
    since timestamptz NOT NULL
);

CREATE FUNCTION workd_ms(ms jsonb) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ms IS NULL OR jsonb_typeof(ms) = 'null' THEN NULL
                ELSE to_timestamp((ms #>> '{}')::bigint / 1000.0) END
$$;

-- Folds one event into workd_work / workd_leader. Mirrors workstate_apply() in
-- server/manager/workstate.c; tests/integration check that the two agree.
CREATE FUNCTION workd_project() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := NEW.data;
BEGIN
    CASE NEW.type
    WHEN 'accepted' THEN
        INSERT INTO workd_work (id, queue, priority, payload, status, max_attempts, timeout_ms,
                                run_at, created_at, accepted_seq, updated_seq)
        VALUES (NEW.work_id, d->>'queue', (d->>'priority')::integer, d->'payload', 'pending',
                (d->>'max_attempts')::integer, (d->>'timeout_ms')::bigint,
                workd_ms(d->'run_at'), NEW.at, NEW.seq, NEW.seq);
    WHEN 'started' THEN
        UPDATE workd_work SET status = 'running', attempts = (d->>'attempt')::integer,
               worker_id = d->>'worker_id', deadline = workd_ms(d->'deadline'),
               started_at = NEW.at, updated_seq = NEW.seq
         WHERE id = NEW.work_id;
    WHEN 'completed' THEN
        UPDATE workd_work SET status = 'completed', result = d->'result', deadline = NULL,
               finished_at = NEW.at, updated_seq = NEW.seq
         WHERE id = NEW.work_id;
    WHEN 'failed', 'timed_out' THEN
        UPDATE workd_work SET status = 'pending', run_at = workd_ms(d->'retry_at'),
               last_error = d->>'error', deadline = NULL, updated_seq = NEW.seq
         WHERE id = NEW.work_id;
    WHEN 'dead' THEN
        UPDATE workd_work SET status = 'dead', finished_at = NEW.at, deadline = NULL,
               last_error = coalesce(d->>'error', last_error), updated_seq = NEW.seq
         WHERE id = NEW.work_id;
    WHEN 'cancelled' THEN
        UPDATE workd_work SET status = 'cancelled', finished_at = NEW.at, deadline = NULL,
               updated_seq = NEW.seq
         WHERE id = NEW.work_id;
    WHEN 'term' THEN
        INSERT INTO workd_leader (id, term, url, since)
        VALUES (1, (d->>'term')::bigint, d->>'leader', NEW.at)
        ON CONFLICT (id) DO UPDATE SET term = EXCLUDED.term, url = EXCLUDED.url,
                                       since = EXCLUDED.since;
        PERFORM pg_notify('workd_leader', d->>'term');
    ELSE
        NULL; -- an event this schema does not project (a newer server's): kept, not folded
    END CASE;
    RETURN NULL;
END
$$;
CREATE TRIGGER workd_events_project AFTER INSERT ON workd_events
    FOR EACH ROW EXECUTE FUNCTION workd_project();

-- Server nodes announce themselves here (not part of the event log).
CREATE TABLE workd_nodes (
    id         text        PRIMARY KEY,
    url        text        NOT NULL,
    roles      text        NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL
);
