-- workd schema, version 19: shards of the WorkManager.
--
-- A cluster has a number of shards, fixed when its database is made
-- (workd_cluster). Each shard is one of the singletons workd had until now:
-- its own leader lock, term, fence and log (its own seqs), its own open work,
-- schedules and batches. A queue belongs to the shard workd_shard_of() names
-- (FNV-1a 32 of its name, modulo the shard count: common/shard.c computes the
-- same), so a queue's order, pause and limits are one shard's.
--
-- The tables stay shared: log, work, inbox, schedules and batches gain a
-- shard column (0 for everything before; adding it rewrites nothing), and
-- readers ask for their shard. One shard is exactly the workd of schema 18:
-- shard 0 keeps the leader lock's key, and workd_leader (now a view) shows it.

-- A server of the old version still running must not append while the
-- tables change under it.
LOCK TABLE workd_log, workd_open, workd_done, workd_inbox IN ACCESS EXCLUSIVE MODE;

CREATE TABLE workd_cluster (
    id         integer     PRIMARY KEY CHECK (id = 1),
    shards     integer     NOT NULL CHECK (shards BETWEEN 1 AND 64),
    hash       text        NOT NULL DEFAULT 'fnv1a32', -- workd_shard_of's; never changes
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO workd_cluster (id, shards) VALUES (1, 1);

-- FNV-1a 32 over the UTF-8 bytes of s (common/shard.c's shard_hash).
CREATE FUNCTION workd_shard_hash(s text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    h bigint := 2166136261;
    b bytea := convert_to(s, 'UTF8');
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN h;
END
$$;

-- The shard a queue's work belongs to.
CREATE FUNCTION workd_shard_of(queue text) RETURNS integer
LANGUAGE sql STABLE STRICT AS $$
    SELECT CASE WHEN c.shards <= 1 THEN 0
                ELSE (public.workd_shard_hash(queue) % c.shards)::integer END
      FROM public.workd_cluster c
$$;

-- The leader lock of a shard is the advisory lock (2003792491, key): shard 0
-- keeps the key of the one leader (1), and 2 stays the migrations'.
CREATE FUNCTION workd_shard_lock(shard integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN shard = 0 THEN 1 ELSE 1000 + shard END
$$;

-- Each shard's leader, as its term events name it (and the backend that
-- wrote the term, for the fence).
CREATE TABLE workd_shards (
    shard integer     PRIMARY KEY CHECK (shard BETWEEN 0 AND 63),
    term  bigint      NOT NULL,
    url   text        NOT NULL,
    since timestamptz NOT NULL,
    pid   integer
);
INSERT INTO workd_shards (shard, term, url, since, pid)
SELECT 0, term, url, since, pid FROM workd_leader;
DROP TABLE workd_leader;
-- Shard 0's leader, where scripts (and a server of schema 18) look for the leader.
CREATE VIEW workd_leader AS
SELECT 1 AS id, term, url, since, pid FROM workd_shards WHERE shard = 0;

ALTER TABLE workd_log ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE workd_open ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE workd_done ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE workd_inbox ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE workd_schedules ADD COLUMN shard smallint NOT NULL DEFAULT 0;
ALTER TABLE workd_batches ADD COLUMN shard smallint NOT NULL DEFAULT 0;

-- A shard tails its own log: the last seq, the records after a seq, the
-- record holding a seq.
DROP INDEX workd_log_last_seq;
CREATE INDEX workd_log_shard_last_seq ON workd_log (shard, last_seq);
-- A shard's leader reads its own inbox, oldest first.
CREATE INDEX workd_inbox_shard ON workd_inbox (shard, n);

-- Work submitted in SQL goes to its queue's shard. (Named in full: it runs
-- inside workd.submit, whose search_path is pg_catalog's.)
CREATE FUNCTION workd_inbox_shard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.shard := public.workd_shard_of(NEW.queue);
    RETURN NEW;
END
$$;
CREATE TRIGGER workd_inbox_shard BEFORE INSERT ON workd_inbox
    FOR EACH ROW EXECUTE FUNCTION workd_inbox_shard();

-- The fence of a shard's appends (schema 15's, per shard): true only in the
-- session holding the shard's leader lock that opened its newest term, or,
-- opening a term, when no term as new exists.
CREATE FUNCTION workd_fence(shard integer, term bigint, opening boolean) RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(2003792491, workd_shard_lock(workd_fence.shard)) THEN
        RETURN false;
    END IF;
    IF opening THEN
        RETURN NOT EXISTS (SELECT 1 FROM workd_shards s
                            WHERE s.shard = workd_fence.shard AND s.term >= workd_fence.term);
    END IF;
    RETURN EXISTS (SELECT 1 FROM workd_shards s
                    WHERE s.shard = workd_fence.shard AND s.term = workd_fence.term
                      AND s.pid = pg_backend_pid());
END
$$;
-- Schema 18's fence, for a server of that version during a rolling upgrade
-- of a one-shard cluster.
CREATE OR REPLACE FUNCTION workd_fence(term bigint, opening boolean) RETURNS boolean
    LANGUAGE sql VOLATILE AS $$
    SELECT workd_fence(0, term, opening)
$$;

-- True only in the session holding the shard's leader lock.
CREATE FUNCTION workd_holds_leader_lock(shard integer) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_locks
                    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                      AND classid = 2003792491 AND objid = workd_shard_lock(shard)
                      AND objsubid = 2)
$$;

-- The control events of a shard's records, folded as schema 18 did, with the
-- shard: a term names the shard's leader, schedules and batches belong to
-- the shard whose log opened them.
DROP TRIGGER workd_log_control ON workd_log;
DROP FUNCTION workd_log_control();
ALTER FUNCTION workd_control_apply(bigint, timestamptz, text, jsonb)
    RENAME TO workd_control_apply_unsharded;

CREATE FUNCTION workd_control_apply(e_shard integer, e_seq bigint, e_at timestamptz,
                                    e_type text, d jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    owner integer;
BEGIN
    CASE e_type
    WHEN 'term' THEN
        INSERT INTO workd_shards (shard, term, url, since, pid)
        VALUES (e_shard, (d->>'term')::bigint, d->>'leader', e_at, pg_backend_pid())
        ON CONFLICT (shard) DO UPDATE SET term = EXCLUDED.term, url = EXCLUDED.url,
                                          since = EXCLUDED.since, pid = EXCLUDED.pid;
        -- Shard 0's payload is the term alone, as before shards.
        PERFORM pg_notify('workd_leader', CASE WHEN e_shard = 0 THEN d->>'term'
                                               ELSE e_shard || ':' || (d->>'term') END);
        RETURN NULL;
    WHEN 'schedule_set' THEN
        SELECT s.shard INTO owner FROM workd_schedules s WHERE s.name = d->>'schedule';
        IF owner IS NOT NULL AND owner <> e_shard THEN
            RAISE EXCEPTION 'schedule % belongs to shard %, not %', d->>'schedule', owner, e_shard
                USING ERRCODE = 'WD002';
        END IF;
        INSERT INTO workd_schedules (name, spec, last_tick, updated_seq, updated_at, shard)
        VALUES (d->>'schedule', d, (d->>'since')::bigint, e_seq, e_at, e_shard)
        ON CONFLICT (name) DO UPDATE
           SET spec = EXCLUDED.spec, last_tick = EXCLUDED.last_tick,
               updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
        RETURN NULL;
    WHEN 'batch_opened' THEN
        INSERT INTO workd_batches (id, callback, opened_seq, opened_at, shard)
        VALUES (d->>'batch', nullif(d->'callback', 'null'::jsonb), e_seq, e_at, e_shard)
        ON CONFLICT (id) DO UPDATE
           SET callback = EXCLUDED.callback, opened_seq = EXCLUDED.opened_seq,
               opened_at = EXCLUDED.opened_at, finished_seq = NULL, finished_at = NULL,
               counts = NULL, callback_id = NULL, shard = EXCLUDED.shard;
        RETURN NULL;
    ELSE
        RETURN workd_control_apply_unsharded(e_seq, e_at, e_type, d);
    END CASE;
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
        kept := workd_control_apply(NEW.shard, (e->>'seq')::bigint,
                                    workd_ts((e->>'at')::bigint), e->>'type', e->'data');
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
CREATE TRIGGER workd_log_control BEFORE INSERT ON workd_log
    FOR EACH ROW WHEN (NEW.control) EXECUTE FUNCTION workd_log_control();

-- The log's events, one per row, with their shard.
CREATE OR REPLACE VIEW workd_events AS
SELECT (x.e->>'seq')::bigint AS seq, l.term, workd_ts((x.e->>'at')::bigint) AS at,
       x.e->>'type' AS type, (x.e->>'v')::smallint AS version, x.e->>'work_id' AS work_id,
       x.e->'data' AS data, l.part, l.shard
  FROM workd_log l
       CROSS JOIN LATERAL (SELECT line::jsonb AS e
                             FROM string_to_table(l.events, E'\n') AS line) x;
