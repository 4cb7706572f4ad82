-- workd schema, version 10: a fence that costs a lock, not a scan of pg_locks.
--
-- workd_holds_leader_lock() read pg_locks, which copies the whole lock table
-- under every partition lock: 0.1-0.3 ms of every commit (pg_stat_statements,
-- docs/benchmarks.md). workd_fence(term, opening) decides the same question
-- from O(1) facts, in the statement that appends:
--   * pg_try_advisory_xact_lock on the leader lock: no other session holds
--     it now (a backend's own session lock does not conflict with itself), and
--     none can take it before this transaction ends;
--   * workd_leader names this term and this backend (pid, recorded by the
--     term event's trigger in the leader's own session): the writer is the
--     session that opened the newest term. A session is one backend process
--     for its whole life, so a manager that lost its session cannot write
--     through another, and a leader of an older term cannot write at all;
--   * the statement that opens a term (opening) needs instead that no term as
--     new as its own was opened.
ALTER TABLE workd_leader ADD COLUMN pid integer;

CREATE OR REPLACE FUNCTION workd_project() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'term' THEN
        INSERT INTO workd_leader (id, term, url, since, pid)
        VALUES (1, (NEW.data->>'term')::bigint, NEW.data->>'leader', NEW.at, pg_backend_pid())
        ON CONFLICT (id) DO UPDATE SET term = EXCLUDED.term, url = EXCLUDED.url,
                                       since = EXCLUDED.since, pid = EXCLUDED.pid;
        PERFORM pg_notify('workd_leader', NEW.data->>'term');
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION workd_fence(term bigint, opening boolean) RETURNS boolean
    LANGUAGE sql VOLATILE AS $$
    SELECT pg_try_advisory_xact_lock(2003792491, 1)
       AND CASE WHEN opening
                THEN NOT EXISTS (SELECT 1 FROM workd_leader l WHERE l.term >= workd_fence.term)
                ELSE EXISTS (SELECT 1 FROM workd_leader l
                              WHERE l.id = 1 AND l.term = workd_fence.term
                                AND l.pid = pg_backend_pid())
           END
$$;
