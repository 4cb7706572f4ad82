-- workd schema, version 15: workd_fence in PL/pgSQL, whose plans live as long
-- as the session.
--
-- Migration 0010 wrote the fence as an SQL function. One with sub-selects is
-- not inlined, and PostgreSQL before 18 parses and plans an SQL function's
-- body again at every execution of the statement that calls it: every append
-- paid 0.17 ms for it, 29 % of the statement (pg_stat_statements,
-- track_functions, 2026-11-23). The same logic in PL/pgSQL plans its queries
-- once per session. Same arguments, same answer.
CREATE OR REPLACE FUNCTION workd_fence(term bigint, opening boolean) RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(2003792491, 1) THEN
        RETURN false;
    END IF;
    IF opening THEN
        RETURN NOT EXISTS (SELECT 1 FROM workd_leader l WHERE l.term >= workd_fence.term);
    END IF;
    RETURN EXISTS (SELECT 1 FROM workd_leader l
                    WHERE l.id = 1 AND l.term = workd_fence.term AND l.pid = pg_backend_pid());
END
$$;
