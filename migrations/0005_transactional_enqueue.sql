-- workd schema, version 5: transactional enqueue. An application that shares
-- workd's database submits work inside its own transaction:
--
--     BEGIN;
--     INSERT INTO orders ...;
--     SELECT workd.submit('{"order": 42}', id => 'order-42', queue => 'mail');
--     COMMIT;
--
-- The work exists if and only if the transaction commits. workd.submit
-- validates like POST /work and writes the item to workd_inbox; the leader
-- is woken by NOTIFY workd_inbox (sent at commit) and moves each item into
-- the log, deleting it from the inbox in the same transaction as its
-- accepted event: a leader killed in between leaves it in the inbox for the
-- next one, so committed work runs once.

CREATE SCHEMA IF NOT EXISTS workd;

-- Submissions waiting for the leader. Its size follows the items committed
-- and not yet taken (normally none): it is not history.
CREATE TABLE workd_inbox (
    n            bigserial   PRIMARY KEY,
    id           text        NOT NULL,
    queue        text        NOT NULL,
    priority     integer     NOT NULL,
    payload      jsonb       NOT NULL,
    run_at       timestamptz,
    timeout_ms   bigint,     -- NULL: the server's --default-timeout
    max_attempts integer,    -- NULL: the server's --default-max-attempts
    at           timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- Raises invalid_parameter_value naming the argument, as POST /work names the field.
CREATE FUNCTION workd.refuse(arg text, rule text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'workd.submit: ''%'' %', arg, rule
        USING ERRCODE = 'invalid_parameter_value', COLUMN = arg;
END
$$;

CREATE FUNCTION workd.submit(payload jsonb, id text DEFAULT NULL, queue text DEFAULT 'default',
                             priority integer DEFAULT 0, run_at timestamptz DEFAULT NULL,
                             timeout interval DEFAULT NULL, max_attempts integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    existing jsonb;
BEGIN
    IF payload IS NULL THEN
        PERFORM workd.refuse('payload', 'is required (any JSON value; ''null''::jsonb for none)');
    END IF;
    IF id IS NULL THEN
        id := gen_random_uuid()::text;
    ELSIF id !~ '^[A-Za-z0-9._:@-]{1,128}$' OR id IN ('.', '..') THEN
        PERFORM workd.refuse('id', 'must be 1-128 characters of A-Z a-z 0-9 . _ : @ - (not . or ..)');
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.-]{1,64}$' THEN
        PERFORM workd.refuse('queue', 'must be 1-64 characters of A-Z a-z 0-9 _ . -');
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -1000000 AND 1000000 THEN
        PERFORM workd.refuse('priority', 'must be an integer from -1000000 to 1000000 (higher runs first)');
    END IF;
    IF run_at > now() + interval '366 days' THEN
        PERFORM workd.refuse('run_at', 'is more than a year ahead');
    END IF;
    IF timeout IS NOT NULL AND (timeout <= interval '0' OR timeout > interval '7 days') THEN
        PERFORM workd.refuse('timeout', 'must be more than 0 and at most 7 days');
    END IF;
    IF max_attempts IS NOT NULL AND max_attempts NOT BETWEEN 1 AND 1000 THEN
        PERFORM workd.refuse('max_attempts', 'must be an integer from 1 to 1000');
    END IF;
    -- The same id with another payload is a conflict, as over HTTP (the
    -- leader checks again when it takes the item, for ids submitted meanwhile).
    SELECT w.payload INTO existing FROM (
        SELECT o.payload FROM workd_open o WHERE o.id = submit.id
        UNION ALL SELECT d.payload FROM workd_done d WHERE d.id = submit.id
        UNION ALL SELECT i.payload FROM workd_inbox i WHERE i.id = submit.id) w LIMIT 1;
    IF FOUND AND existing IS DISTINCT FROM payload THEN
        RAISE EXCEPTION 'workd.submit: work ''%'' already exists with a different payload; use another id', id
            USING ERRCODE = 'unique_violation', COLUMN = 'id';
    END IF;
    INSERT INTO workd_inbox (id, queue, priority, payload, run_at, timeout_ms, max_attempts)
    VALUES (id, queue, priority, payload, run_at,
            (extract(epoch from timeout) * 1000)::bigint, max_attempts);
    PERFORM pg_notify('workd_inbox', '');
    RETURN id;
END
$$;
REVOKE ALL ON FUNCTION workd.submit(jsonb, text, text, integer, timestamptz, interval, integer)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION workd.refuse(text, text) FROM PUBLIC;

-- The role applications are granted to submit, and nothing else. Creating a
-- role needs CREATEROLE; where workd's own role lacks it (some managed
-- services), an administrator runs these two statements and the GRANTs below.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'workd_submitter') THEN
        BEGIN
            CREATE ROLE workd_submitter NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'workd: cannot create role workd_submitter (no CREATEROLE): see docs/operations.md';
            RETURN;
        END;
    END IF;
    GRANT USAGE ON SCHEMA workd TO workd_submitter;
    GRANT EXECUTE ON FUNCTION workd.submit(jsonb, text, text, integer, timestamptz, interval, integer)
        TO workd_submitter;
END
$$;
