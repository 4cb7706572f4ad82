-- workd schema, version 11: schedules, dependencies and batches.
--
-- Work may wait for other work (after): its parents and what to do when one
-- of them fails are kept with the work, and children are found by parent
-- through a GIN index. Work may belong to a batch. Both indexes are partial,
-- so work without parents or batch writes no entry in them.
ALTER TABLE workd_open ADD COLUMN after jsonb;        -- parent ids (array); NULL: none
ALTER TABLE workd_open ADD COLUMN after_policy text;  -- cancel | run (run anyway)
ALTER TABLE workd_open ADD COLUMN batch text;
ALTER TABLE workd_done ADD COLUMN after jsonb;
ALTER TABLE workd_done ADD COLUMN after_policy text;
ALTER TABLE workd_done ADD COLUMN batch text;
CREATE INDEX workd_open_batch ON workd_open (batch) WHERE batch IS NOT NULL;
CREATE INDEX workd_done_batch ON workd_done (batch) WHERE batch IS NOT NULL;
CREATE INDEX workd_open_after ON workd_open USING gin (after jsonb_path_ops)
    WHERE after IS NOT NULL;
CREATE INDEX workd_done_after ON workd_done USING gin (after jsonb_path_ops)
    WHERE after IS NOT NULL;

-- Schedules and batches outlive the events that define them (a part is
-- dropped after --retain): their state is folded here in the same
-- transaction as their events, and a new leader reads it back at election.
CREATE TABLE workd_schedules (
    name          text        PRIMARY KEY,
    spec          jsonb       NOT NULL,  -- the schedule_set event's data
    last_tick     bigint      NOT NULL,  -- ms: ticks after this one are due
    last_work     text,                  -- the work of the last tick that ran
    last_fired_at timestamptz,
    updated_seq   bigint      NOT NULL,
    updated_at    timestamptz NOT NULL
);

CREATE TABLE workd_batches (
    id           text        PRIMARY KEY,
    callback     jsonb,                  -- a work template; NULL: none
    opened_seq   bigint      NOT NULL,
    opened_at    timestamptz NOT NULL,
    finished_seq bigint,                 -- NULL: open
    finished_at  timestamptz,
    counts       jsonb,                  -- when finished: {completed, dead, cancelled}
    callback_id  text
);

CREATE FUNCTION workd_flow_project() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := NEW.data;
BEGIN
    CASE NEW.type
    WHEN 'schedule_set' THEN
        INSERT INTO workd_schedules (name, spec, last_tick, updated_seq, updated_at)
        VALUES (d->>'schedule', d, (d->>'since')::bigint, NEW.seq, NEW.at)
        ON CONFLICT (name) DO UPDATE
           SET spec = EXCLUDED.spec, last_tick = EXCLUDED.last_tick,
               updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
    WHEN 'schedule_deleted' THEN
        DELETE FROM workd_schedules WHERE name = d->>'schedule';
    WHEN 'tick' THEN
        UPDATE workd_schedules
           SET last_tick = (d->>'tick')::bigint,
               last_work = coalesce(d->>'work_id', last_work),
               last_fired_at = CASE WHEN d->>'work_id' IS NULL THEN last_fired_at ELSE NEW.at END
         WHERE name = d->>'schedule';
    WHEN 'batch_opened' THEN
        INSERT INTO workd_batches (id, callback, opened_seq, opened_at)
        VALUES (d->>'batch', nullif(d->'callback', 'null'::jsonb), NEW.seq, NEW.at)
        ON CONFLICT (id) DO UPDATE
           SET callback = EXCLUDED.callback, opened_seq = EXCLUDED.opened_seq,
               opened_at = EXCLUDED.opened_at, finished_seq = NULL, finished_at = NULL,
               counts = NULL, callback_id = NULL;
    WHEN 'batch' THEN
        UPDATE workd_batches
           SET finished_seq = NEW.seq, finished_at = NEW.at,
               counts = jsonb_build_object('completed', d->'completed', 'dead', d->'dead',
                                           'cancelled', d->'cancelled'),
               callback_id = d->>'callback_id'
         WHERE id = d->>'batch';
    END CASE;
    RETURN NULL;
END
$$;
CREATE TRIGGER workd_events_flow AFTER INSERT ON workd_events
    FOR EACH ROW
    WHEN (NEW.type IN ('schedule_set', 'schedule_deleted', 'tick', 'batch_opened', 'batch'))
    EXECUTE FUNCTION workd_flow_project();
