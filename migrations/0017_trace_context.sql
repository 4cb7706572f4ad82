-- workd schema, version 17: a producer's trace context travels with its work.
--
-- A W3C traceparent and tracestate given with a submission (POST /work's
-- headers or fields, or workd.submit's arguments) are kept with the work and
-- handed to every attempt's worker, and come back with the result
-- (docs/worker-api.md, "Trace context"):
-- * workd_open.trace, workd_done.trace: {"traceparent", "tracestate"?} as the
--   work's accepted event carries it; NULL for work without one, which is
--   most work and costs it nothing;
-- * workd_inbox.traceparent, tracestate: what workd.submit was given; the
--   leader checks them when it takes the item, with the same code as POST
--   /work, and ignores a value that is not a W3C one, as HTTP does;
-- * workd.submit takes them as two more optional arguments, so every call
--   written before goes on working. The function it was moves, unchanged, to
--   the schema workd_internal (callable by workd's own role only) and keeps
--   the checks and the insert of a submission in one place; the new
--   workd.submit calls it, then records the context on the inbox row it
--   wrote. (Beside it under the same name, an overload would make every call
--   without the new arguments ambiguous; renamed, its body's parameters,
--   qualified by the function's name, would no longer resolve.)
ALTER TABLE workd_open ADD COLUMN trace jsonb;
ALTER TABLE workd_done ADD COLUMN trace jsonb;
ALTER TABLE workd_inbox ADD COLUMN traceparent text, ADD COLUMN tracestate text;

CREATE SCHEMA workd_internal;
REVOKE ALL ON SCHEMA workd_internal FROM PUBLIC;
ALTER FUNCTION workd.submit SET SCHEMA workd_internal;

CREATE FUNCTION workd.submit(payload jsonb, id text DEFAULT NULL, queue text DEFAULT 'default',
                             priority integer DEFAULT 0, run_at timestamptz DEFAULT NULL,
                             timeout interval DEFAULT NULL, max_attempts integer DEFAULT NULL,
                             traceparent text DEFAULT NULL, tracestate text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    work_id text;
BEGIN
    work_id := workd_internal.submit(submit.payload, submit.id, submit.queue, submit.priority,
                                     submit.run_at, submit.timeout, submit.max_attempts);
    -- Most submissions have no trace context and write nothing more. A value
    -- longer than any valid one is dropped here (bounded as over HTTP); the
    -- leader reads the rest with the checks of POST /work.
    IF submit.traceparent IS NOT NULL AND octet_length(submit.traceparent) <= 512 THEN
        UPDATE public.workd_inbox i
           SET traceparent = submit.traceparent,
               tracestate = CASE WHEN octet_length(submit.tracestate) <= 512
                                 THEN submit.tracestate END
         WHERE i.n = currval(pg_get_serial_sequence('public.workd_inbox', 'n'))
           AND i.id = work_id;
    END IF;
    RETURN work_id;
END
$$;
REVOKE ALL ON FUNCTION workd.submit(jsonb, text, text, integer, timestamptz, interval, integer,
                                    text, text) FROM PUBLIC;

-- workd_submitter (migration 5) may call the new function, and no longer the
-- old one directly. Where the role could not be created, an administrator
-- grants it as docs/sql-submit.md says.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'workd_submitter') THEN
        GRANT EXECUTE ON FUNCTION workd.submit(jsonb, text, text, integer, timestamptz, interval,
                                               integer, text, text) TO workd_submitter;
        REVOKE EXECUTE ON FUNCTION workd_internal.submit FROM workd_submitter;
    END IF;
END
$$;
