-- workd schema, version 2: dead work can be retried (a 'retried' event reopens
-- it with one more attempt), and work can be listed newest first.
CREATE INDEX workd_work_by_seq ON workd_work (accepted_seq);

CREATE OR REPLACE FUNCTION workd_project() RETURNS trigger LANGUAGE plpgsql AS $$
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
    WHEN 'retried' THEN
        -- Reopened work queues behind what is pending now, as the manager orders it.
        UPDATE workd_work SET status = 'pending', max_attempts = (d->>'max_attempts')::integer,
               run_at = NULL, finished_at = NULL, deadline = NULL, accepted_seq = NEW.seq,
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
