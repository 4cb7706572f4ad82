-- workd schema, version 13: webhook subscriptions. An operator's subscription
-- event (set, paused, deleted: all of it, not a change) and the leader's
-- subscription_cursor events (how far deliveries got) are folded here in the
-- same transaction, so that a new leader resumes every subscription from its
-- last recorded cursor (the events themselves leave with their part).
CREATE TABLE workd_subscriptions (
    name          text        PRIMARY KEY,
    url           text        NOT NULL,
    secret        text        NOT NULL, -- whsec_<base64>: the deliveries' HMAC key
    queues        text[],               -- NULL: every queue
    kinds         text[]      NOT NULL, -- completed, dead, cancelled
    paused        boolean     NOT NULL,
    paused_reason text,
    cursor        bigint      NOT NULL, -- every event up to this seq was delivered or skipped
    updated_seq   bigint      NOT NULL,
    updated_at    timestamptz NOT NULL
);

CREATE FUNCTION workd_subscription_project() RETURNS trigger LANGUAGE plpgsql AS $$
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
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER workd_events_subscription AFTER INSERT ON workd_events
    FOR EACH ROW WHEN (NEW.type IN ('subscription', 'subscription_cursor'))
    EXECUTE FUNCTION workd_subscription_project();
