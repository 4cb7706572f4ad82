-- workd schema, version 3: the leader writes workd_work itself, set-based, in
-- the statement that appends the events (server/manager/projection.c folds
-- them); the per-row trigger cost more than the event insert. Only term events
-- still fire a trigger (cheaply filtered by WHEN), for workd_leader.
DROP TRIGGER workd_events_project ON workd_events;
CREATE TRIGGER workd_events_leader AFTER INSERT ON workd_events
    FOR EACH ROW WHEN (NEW.type = 'term') EXECUTE FUNCTION workd_project();

-- Fencing in one place: true only in the session holding the leader lock.
CREATE FUNCTION workd_holds_leader_lock() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_locks
                    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                      AND classid = 2003792491 AND objid = 1 AND objsubid = 2)
$$;

CREATE FUNCTION workd_ts(ms bigint) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN ms IS NULL THEN NULL ELSE to_timestamp(ms / 1000.0) END
$$;
