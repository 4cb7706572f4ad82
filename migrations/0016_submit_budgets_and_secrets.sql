-- workd schema, version 16: workd.submit keeps the budgets of HTTP, resolves
-- no name through the caller's search path, and webhook secrets leave the log.
--
-- * workd_budgets: the leader's --max-body and --max-json-depth, written by
--   each new leader at election (one row). workd.submit refuses a payload
--   larger or deeper than a client's POST /work could send, inside the
--   caller's transaction, so that such work never commits.
-- * workd.submit runs with search_path = pg_catalog, pg_temp and names every
--   table with its schema: a caller's temporary table named like one of
--   workd's cannot stand in for it.
-- * A subscription event no longer keeps the signing secret or the
--   credentials of its URL: a BEFORE INSERT trigger folds the event into
--   workd_subscriptions (not history: one row per subscription, deleted with
--   it) and strips both from the row that goes into the log. Events written
--   before this version keep theirs until their part is dropped (--retain).

CREATE TABLE workd_budgets (
    id            integer     PRIMARY KEY CHECK (id = 1),
    payload_bytes bigint      NOT NULL, -- a payload's JSON text at most (--max-body)
    json_depth    integer     NOT NULL, -- a request body's nesting at most (--max-json-depth)
    updated_at    timestamptz NOT NULL
);
INSERT INTO workd_budgets VALUES (1, 1048576, 32, now());

CREATE OR REPLACE FUNCTION workd.refuse(arg text, rule text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'workd.submit: ''%'' %', arg, rule
        USING ERRCODE = 'invalid_parameter_value', COLUMN = arg;
END
$$;

-- The function with the checks and the insert: workd.submit, or, where
-- schema 17 (trace context) came first, workd_internal.submit, which the
-- workd.submit of schema 17 calls (same arguments, same body either way).
DO $do$
DECLARE
    target text := CASE WHEN to_regprocedure('workd_internal.submit(jsonb, text, text, integer,'
                                             ' timestamptz, interval, integer)') IS NOT NULL
                        THEN 'workd_internal' ELSE 'workd' END;
BEGIN
    EXECUTE replace($fn$
CREATE OR REPLACE FUNCTION SCHEMA_OF_SUBMIT.submit(payload jsonb, id text DEFAULT NULL,
                                        queue text DEFAULT 'default', priority integer DEFAULT 0,
                                        run_at timestamptz DEFAULT NULL,
                                        timeout interval DEFAULT NULL,
                                        max_attempts integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
    existing jsonb;
    budget   public.workd_budgets;
    bytes    bigint;
BEGIN
    IF payload IS NULL THEN
        PERFORM workd.refuse('payload', 'is required (any JSON value; ''null''::jsonb for none)');
    END IF;
    -- The budgets of POST /work: its whole body is at most --max-body bytes
    -- and --max-json-depth deep, so a payload in it is at most that large and
    -- one level less deep.
    SELECT * INTO budget FROM public.workd_budgets b WHERE b.id = 1;
    bytes := octet_length(payload::text);
    IF bytes > budget.payload_bytes THEN
        RAISE EXCEPTION 'workd.submit: ''payload'' is % bytes as JSON text; the limit is % (the server''s --max-body)',
            bytes, budget.payload_bytes
            USING ERRCODE = 'program_limit_exceeded', COLUMN = 'payload';
    END IF;
    IF jsonb_path_exists(payload, format('strict $.**{%s} ? (@.type() == "object" || @.type() == "array")',
                                         budget.json_depth - 1)::jsonpath) THEN
        RAISE EXCEPTION 'workd.submit: ''payload'' is nested more than % deep (the server''s --max-json-depth, less the body''s own level)',
            budget.json_depth - 1
            USING ERRCODE = 'program_limit_exceeded', COLUMN = 'payload';
    END IF;
    IF id IS NULL THEN
        id := gen_random_uuid()::text;
    ELSIF id !~ '^[A-Za-z0-9._:@-]{1,128}$' OR id IN ('.', '..') THEN
        PERFORM workd.refuse('id', 'must be 1-128 characters of A-Z a-z 0-9 . _ : @ - (not . or ..)');
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.-]{1,64}$' OR queue IN ('.', '..') THEN
        PERFORM workd.refuse('queue', 'must be 1-64 characters of A-Z a-z 0-9 _ . - (not . or ..)');
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
    -- The same id with another payload is a conflict, answered as POST /work
    -- answers a client (409): that the id is taken, nothing of the work that
    -- holds it. The leader checks again when it takes the item.
    SELECT w.payload INTO existing FROM (
        SELECT o.payload FROM public.workd_open o WHERE o.id = submit.id
        UNION ALL SELECT d.payload FROM public.workd_done d WHERE d.id = submit.id
        UNION ALL SELECT i.payload FROM public.workd_inbox i WHERE i.id = submit.id) w LIMIT 1;
    IF FOUND AND existing IS DISTINCT FROM payload THEN
        RAISE EXCEPTION 'workd.submit: work ''%'' already exists with a different payload; use another id', id
            USING ERRCODE = 'unique_violation', COLUMN = 'id';
    END IF;
    INSERT INTO public.workd_inbox (id, queue, priority, payload, run_at, timeout_ms, max_attempts)
    VALUES (id, queue, priority, payload, run_at,
            (extract(epoch from timeout) * 1000)::bigint, max_attempts);
    PERFORM pg_notify('workd_inbox', '');
    RETURN id;
END
$body$
$fn$, 'SCHEMA_OF_SUBMIT', target);
END
$do$;

-- ---- webhook secrets out of the log ----

-- The URL without the user information of its authority ("https://u:p@h/x"
-- gives "https://***@h/x").
CREATE FUNCTION workd_url_redacted(url text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT regexp_replace(url, '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@', '\1***@')
$$;

DROP TRIGGER workd_events_subscription ON workd_events;
CREATE OR REPLACE FUNCTION workd_subscription_project() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d jsonb := NEW.data;
BEGIN
    IF NEW.type = 'subscription_cursor' THEN
        -- Cursors only move forward here; an operator's reset is a subscription event.
        UPDATE workd_subscriptions SET cursor = greatest(cursor, (d->>'cursor')::bigint)
         WHERE name = d->>'name';
    ELSIF coalesce((d->>'deleted')::boolean, false) THEN
        DELETE FROM workd_subscriptions WHERE name = d->>'name';
    ELSE
        INSERT INTO workd_subscriptions (name, url, secret, queues, kinds, paused, paused_reason,
                                         cursor, updated_seq, updated_at)
        VALUES (d->>'name', d->>'url', d->>'secret',
                CASE WHEN jsonb_typeof(d->'queues') = 'array'
                     THEN ARRAY(SELECT jsonb_array_elements_text(d->'queues')) END,
                ARRAY(SELECT jsonb_array_elements_text(d->'kinds')),
                (d->>'paused')::boolean, d->>'paused_reason',
                coalesce((d->>'cursor')::bigint, (d->>'start')::bigint, 0), NEW.seq, NEW.at)
        ON CONFLICT (name) DO UPDATE
           SET url = EXCLUDED.url, secret = EXCLUDED.secret, queues = EXCLUDED.queues,
               kinds = EXCLUDED.kinds, paused = EXCLUDED.paused,
               paused_reason = EXCLUDED.paused_reason,
               cursor = CASE WHEN d ? 'cursor' THEN EXCLUDED.cursor
                             ELSE workd_subscriptions.cursor END,
               updated_seq = EXCLUDED.updated_seq, updated_at = EXCLUDED.updated_at;
        -- What goes into the log: the settings, without the secret and the
        -- URL's credentials (both are in workd_subscriptions only).
        NEW.data := jsonb_set(d - 'secret', '{url}', to_jsonb(workd_url_redacted(d->>'url')));
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER workd_events_subscription BEFORE INSERT ON workd_events
    FOR EACH ROW WHEN (NEW.type IN ('subscription', 'subscription_cursor'))
    EXECUTE FUNCTION workd_subscription_project();
