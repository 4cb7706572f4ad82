-- workd schema, version 18: the log as one record per commit.
--
-- Until now every event was a row of workd_events with two index entries of
-- its own (seq, and work_id with seq): a drained job wrote three of them.
-- Now the leader writes each commit's events as records of workd_log: the
-- events as lines of JSON text, in seq order, a record holding a run of seqs
-- (first_seq..last_seq, of one term) and cut at about 7 kB so that it stays
-- on its heap page, uncompressed and out of TOAST. One index, on last_seq,
-- finds the record holding any seq and tails the log. A work item's own
-- events are found through its row's history (the seqs of its events, which
-- grows by a few per job) and, for its progress reports, which may be
-- thousands, through workd_progress (one small row per report, indexed by
-- work id and seq, partitioned by part like the log).
--
-- A line is {"seq":N,"at":MS,"type":"T","v":V,"work_id":"ID"|null,"data":{...}}
-- with exactly that prefix (workd_log_line writes it, as the server does), so
-- a reader finds an event's seq and type without parsing the rest.
--
-- Records holding an event the database keeps a table for (term,
-- queue_set, schedules, ticks, batches, subscriptions) are marked control;
-- a trigger folds those events into their tables, as the per-event
-- triggers did, and keeps webhook secrets out of the log.
--
-- workd_events stays, as a view that reads the records back one event per
-- row, for people and scripts that read the log in SQL.

-- A server of the old version still running must not append while the
-- events are moved: it waits here, then finds no table to append to.
LOCK TABLE workd_events, workd_open, workd_done, workd_inbox IN ACCESS EXCLUSIVE MODE;

CREATE TABLE workd_log (
    first_seq bigint      NOT NULL,
    last_seq  bigint      NOT NULL,
    term      bigint      NOT NULL,
    last_at   timestamptz NOT NULL, -- its last event's time (retention)
    control   boolean     NOT NULL DEFAULT false,
    events    text        NOT NULL,
    part      integer     NOT NULL
) PARTITION BY RANGE (part);
CREATE INDEX workd_log_last_seq ON workd_log (last_seq);
-- A large record (a large payload or result) is compressed with lz4 where
-- the server has it.
DO $$
BEGIN
    ALTER TABLE workd_log ALTER COLUMN events SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    NULL;
END
$$;

CREATE FUNCTION workd_log_line(seq bigint, at_ms bigint, type text, version integer,
                               work_id text, data jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{"seq":' || seq || ',"at":' || at_ms || ',"type":' || to_json(type)::text
        || ',"v":' || version || ',"work_id":' || coalesce(to_json(work_id)::text, 'null')
        || ',"data":' || data::text || '}'
$$;

-- A work item's progress reports (their lines are in the log).
CREATE TABLE workd_progress (
    work_id text    NOT NULL,
    seq     bigint  NOT NULL,
    part    integer NOT NULL
) PARTITION BY RANGE (part);
CREATE INDEX workd_progress_work ON workd_progress (work_id, seq);

-- ---- the parts ----
CREATE OR REPLACE FUNCTION workd_part_add(p integer, s timestamptz, e timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['workd_log', 'workd_done', 'workd_progress'] LOOP
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING COMPRESSION,'
                       ' CHECK (part = %s))', t || '_p' || p, t, p);
        PERFORM workd_part_protect(t || '_p' || p);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                       t, t || '_p' || p, p, p + 1);
    END LOOP;
    -- A record up to a page's size stays on its page, uncompressed.
    EXECUTE format('ALTER TABLE %I SET (toast_tuple_target = 8160)', 'workd_log_p' || p);
    INSERT INTO workd_parts (part, starts_at, ends_at) VALUES (p, s, e);
END
$$;

DO $$
DECLARE
    p integer;
BEGIN
    FOR p IN SELECT part FROM workd_parts ORDER BY part LOOP
        EXECUTE format('CREATE TABLE %I (LIKE workd_log INCLUDING DEFAULTS INCLUDING COMPRESSION,'
                       ' CHECK (part = %s))', 'workd_log_p' || p, p);
        EXECUTE format('ALTER TABLE %I SET (toast_tuple_target = 8160)', 'workd_log_p' || p);
        PERFORM workd_part_protect('workd_log_p' || p);
        EXECUTE format('ALTER TABLE workd_log ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                       'workd_log_p' || p, p, p + 1);
        EXECUTE format('CREATE TABLE %I (LIKE workd_progress INCLUDING DEFAULTS, CHECK (part = %s))',
                       'workd_progress_p' || p, p);
        PERFORM workd_part_protect('workd_progress_p' || p);
        EXECUTE format('ALTER TABLE workd_progress ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                       'workd_progress_p' || p, p, p + 1);
    END LOOP;
END
$$;

-- ---- the events, moved into records ----
-- Final events name their queue since schema 4 and dead ones their attempts
-- since schema 3; older ones take them from their work's row here, so that a
-- reader of the log needs no other table.
INSERT INTO workd_log (first_seq, last_seq, term, last_at, control, events, part)
SELECT min(seq), max(seq), term, max(at), false, string_agg(line, E'\n' ORDER BY seq), part
  FROM (SELECT e.seq, e.term, e.at, e.part,
               workd_log_line(e.seq, workd_epoch_ms(e.at), e.type, e.version, e.work_id,
                   CASE WHEN e.type IN ('completed', 'dead', 'cancelled')
                         AND NOT (e.data ? 'queue') THEN
                            e.data || jsonb_build_object('queue', coalesce(
                                (SELECT d.queue FROM workd_done d WHERE d.id = e.work_id LIMIT 1),
                                (SELECT o.queue FROM workd_open o WHERE o.id = e.work_id), ''))
                        ELSE e.data END
                   || CASE WHEN e.type = 'dead' AND NOT (e.data ? 'attempts') THEN
                            coalesce((SELECT jsonb_build_object('attempts', o.attempts)
                                        FROM workd_open o WHERE o.id = e.work_id), '{}')
                       ELSE '{}' END) AS line
          FROM workd_events e) x
 GROUP BY part, term, seq / 64;

-- ---- a work item's events, through its row ----
INSERT INTO workd_progress (work_id, seq, part)
SELECT work_id, seq, part FROM workd_events WHERE type = 'progress';
ALTER TABLE workd_open ADD COLUMN history bigint[];
ALTER TABLE workd_done ADD COLUMN history bigint[];
CREATE TEMPORARY TABLE workd_history ON COMMIT DROP AS
SELECT work_id, array_agg(seq ORDER BY seq) AS history
  FROM workd_events WHERE work_id IS NOT NULL AND type <> 'progress' GROUP BY work_id;
UPDATE workd_open o SET history = h.history FROM workd_history h WHERE h.work_id = o.id;
-- Finished rows refuse every UPDATE: the refusal steps aside for this
-- statement only, in this transaction, which no other session sees.
CREATE OR REPLACE FUNCTION workd_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN TG_LEVEL = 'ROW' THEN NEW END;
END
$$;
UPDATE workd_done w SET history = h.history FROM workd_history h WHERE h.work_id = w.id;
CREATE OR REPLACE FUNCTION workd_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- ---- the tables the database keeps from the log ----
-- One function for every kind of event a table is kept for (the bodies of
-- the per-event triggers of schemas 4 to 16). It returns the data the log
-- keeps when that differs from the event's (a subscription's, without its
-- secret), else NULL.
CREATE FUNCTION workd_control_apply(e_seq bigint, e_at timestamptz, e_type text, d jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    CASE e_type
    WHEN 'term' THEN
        INSERT INTO workd_leader (id, term, url, since, pid)
        VALUES (1, (d->>'term')::bigint, d->>'leader', e_at, pg_backend_pid())
        ON CONFLICT (id) DO UPDATE SET term = EXCLUDED.term, url = EXCLUDED.url,
                                       since = EXCLUDED.since, pid = EXCLUDED.pid;
        PERFORM pg_notify('workd_leader', d->>'term');
    WHEN 'queue_set' THEN
        INSERT INTO workd_queues (queue, paused, max_running, max_running_per_key, rate_limit,
                                  rate_period_ms, key_weights, updated_seq, updated_at)
        VALUES (d->>'queue', (d->>'paused')::boolean,
                (d->>'max_running')::integer, (d->>'max_running_per_key')::integer,
                (d->'rate'->>'limit')::integer, (d->'rate'->>'period_ms')::bigint,
                d->'key_weights', e_seq, e_at)
        ON CONFLICT (queue) DO UPDATE
           SET paused = EXCLUDED.paused, max_running = EXCLUDED.max_running,
               max_running_per_key = EXCLUDED.max_running_per_key,
               rate_limit = EXCLUDED.rate_limit, rate_period_ms = EXCLUDED.rate_period_ms,
               key_weights = EXCLUDED.key_weights,
               updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
    WHEN 'schedule_set' THEN
        INSERT INTO workd_schedules (name, spec, last_tick, updated_seq, updated_at)
        VALUES (d->>'schedule', d, (d->>'since')::bigint, e_seq, e_at)
        ON CONFLICT (name) DO UPDATE
           SET spec = EXCLUDED.spec, last_tick = EXCLUDED.last_tick,
               updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
    WHEN 'schedule_deleted' THEN
        DELETE FROM workd_schedules WHERE name = d->>'schedule';
    WHEN 'tick' THEN
        UPDATE workd_schedules
           SET last_tick = (d->>'tick')::bigint,
               last_work = coalesce(d->>'work_id', last_work),
               last_fired_at = CASE WHEN d->>'work_id' IS NULL THEN last_fired_at ELSE e_at END
         WHERE name = d->>'schedule';
    WHEN 'batch_opened' THEN
        INSERT INTO workd_batches (id, callback, opened_seq, opened_at)
        VALUES (d->>'batch', nullif(d->'callback', 'null'::jsonb), e_seq, e_at)
        ON CONFLICT (id) DO UPDATE
           SET callback = EXCLUDED.callback, opened_seq = EXCLUDED.opened_seq,
               opened_at = EXCLUDED.opened_at, finished_seq = NULL, finished_at = NULL,
               counts = NULL, callback_id = NULL;
    WHEN 'batch' THEN
        UPDATE workd_batches
           SET finished_seq = e_seq, finished_at = e_at,
               counts = jsonb_build_object('completed', d->'completed', 'dead', d->'dead',
                                           'cancelled', d->'cancelled'),
               callback_id = d->>'callback_id'
         WHERE id = d->>'batch';
    WHEN 'subscription_cursor' THEN
        -- Cursors only move forward here; an operator's reset is a subscription event.
        UPDATE workd_subscriptions SET cursor = greatest(cursor, (d->>'cursor')::bigint)
         WHERE name = d->>'name';
    WHEN 'subscription' THEN
        IF coalesce((d->>'deleted')::boolean, false) THEN
            DELETE FROM workd_subscriptions WHERE name = d->>'name';
            RETURN NULL;
        END IF;
        INSERT INTO workd_subscriptions (name, url, secret, queues, kinds, paused, paused_reason,
                                         cursor, updated_seq, updated_at)
        VALUES (d->>'name', d->>'url', d->>'secret',
                CASE WHEN jsonb_typeof(d->'queues') = 'array'
                     THEN ARRAY(SELECT jsonb_array_elements_text(d->'queues')) END,
                ARRAY(SELECT jsonb_array_elements_text(d->'kinds')),
                (d->>'paused')::boolean, d->>'paused_reason',
                coalesce((d->>'cursor')::bigint, (d->>'start')::bigint, 0), e_seq, e_at)
        ON CONFLICT (name) DO UPDATE
           SET url = EXCLUDED.url, secret = EXCLUDED.secret, queues = EXCLUDED.queues,
               kinds = EXCLUDED.kinds, paused = EXCLUDED.paused,
               paused_reason = EXCLUDED.paused_reason,
               cursor = CASE WHEN d ? 'cursor' THEN EXCLUDED.cursor
                             ELSE workd_subscriptions.cursor END,
               updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
        -- What goes into the log: the settings, without the secret and the
        -- URL's credentials (both are in workd_subscriptions only).
        RETURN jsonb_set(d - 'secret', '{url}', to_jsonb(workd_url_redacted(d->>'url')));
    ELSE
        NULL;
    END CASE;
    RETURN NULL;
END
$$;

CREATE FUNCTION workd_log_control() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    line text;
    e jsonb;
    kept jsonb;
    lines text[] := '{}';
BEGIN
    FOR line IN SELECT string_to_table(NEW.events, E'\n') LOOP
        e := line::jsonb;
        kept := workd_control_apply((e->>'seq')::bigint, workd_ts((e->>'at')::bigint),
                                    e->>'type', e->'data');
        IF kept IS NOT NULL THEN
            line := workd_log_line((e->>'seq')::bigint, (e->>'at')::bigint, e->>'type',
                                   (e->>'v')::integer, e->>'work_id', kept);
        END IF;
        lines := lines || line;
    END LOOP;
    NEW.events := array_to_string(lines, E'\n');
    RETURN NEW;
END
$$;

-- ---- the old log goes; a view reads the records back as events ----
DROP TABLE workd_events CASCADE;
DROP FUNCTION workd_project();
DROP FUNCTION workd_queue_project();
DROP FUNCTION workd_flow_project();
DROP FUNCTION workd_subscription_project();

CREATE VIEW workd_events AS
SELECT (x.e->>'seq')::bigint AS seq, l.term, workd_ts((x.e->>'at')::bigint) AS at,
       x.e->>'type' AS type, (x.e->>'v')::smallint AS version, x.e->>'work_id' AS work_id,
       x.e->'data' AS data, l.part
  FROM workd_log l
       CROSS JOIN LATERAL (SELECT line::jsonb AS e
                             FROM string_to_table(l.events, E'\n') AS line) x;

-- ---- the rules the database keeps ----
CREATE TRIGGER workd_log_no_rewrite BEFORE UPDATE OR DELETE ON workd_log
    FOR EACH ROW EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_log_no_rewrite_stmt BEFORE UPDATE OR DELETE OR TRUNCATE ON workd_log
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_progress_no_rewrite BEFORE UPDATE OR DELETE ON workd_progress
    FOR EACH ROW EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_progress_no_rewrite_stmt BEFORE UPDATE OR DELETE OR TRUNCATE ON workd_progress
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_log_control BEFORE INSERT ON workd_log
    FOR EACH ROW WHEN (NEW.control) EXECUTE FUNCTION workd_log_control();
