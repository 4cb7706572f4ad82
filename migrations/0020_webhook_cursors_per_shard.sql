-- workd schema, version 20: a webhook subscription's cursor in every shard.
--
-- The deliveries follow every shard's log, so how far they got is a seq per
-- shard. In a cluster of several shards the subscription events carry them
-- beside shard 0's (`cursors` beside `cursor`, `starts` beside `start`), and
-- workd_subscriptions keeps them in `cursors` (cursors[1] is `cursor`). A
-- cluster of one shard writes and keeps what it did before: `cursors` stays
-- NULL, read as ARRAY[cursor].

ALTER TABLE workd_subscriptions ADD COLUMN cursors bigint[];

-- The element-wise greatest of two cursors (a missing element counts as 0).
CREATE FUNCTION workd_cursor_max(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT greatest(coalesce(x.v, 0), coalesce(y.v, 0))
                   FROM unnest(coalesce(a, '{}')) WITH ORDINALITY x(v, i)
                   FULL JOIN unnest(coalesce(b, '{}')) WITH ORDINALITY y(v, i) USING (i)
                  ORDER BY i)
$$;

-- A JSON array of seqs as bigint[], in its order (NULL when it is none).
CREATE FUNCTION workd_cursor_of(j jsonb) RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(j) = 'array' THEN
                ARRAY(SELECT v::bigint FROM jsonb_array_elements_text(j) WITH ORDINALITY x(v, i)
                       ORDER BY i) END
$$;

-- Schema 19's function stays for every other kind of event; the
-- subscription events that carry a place per shard are folded here first.
ALTER FUNCTION workd_control_apply(integer, bigint, timestamptz, text, jsonb)
    RENAME TO workd_control_apply_v19;

CREATE FUNCTION workd_control_apply(e_shard integer, e_seq bigint, e_at timestamptz,
                                    e_type text, d jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    kept jsonb;
BEGIN
    IF e_type = 'subscription_cursor' AND d ? 'cursors' THEN
        -- Each shard's cursor only moves forward; a reset is a subscription event.
        UPDATE workd_subscriptions
           SET cursor = greatest(cursor, (d->>'cursor')::bigint),
               cursors = workd_cursor_max(coalesce(cursors, ARRAY[cursor]),
                                          workd_cursor_of(d->'cursors'))
         WHERE name = d->>'name';
        RETURN NULL;
    END IF;
    kept := workd_control_apply_v19(e_shard, e_seq, e_at, e_type, d);
    IF e_type = 'subscription' AND (d ? 'cursors' OR d ? 'starts')
       AND NOT coalesce((d->>'deleted')::boolean, false) THEN
        -- A reset takes its cursors; a new subscription starts at every
        -- shard's end; a change keeps what it had.
        UPDATE workd_subscriptions
           SET cursors = coalesce(workd_cursor_of(d->'cursors'), cursors,
                                  workd_cursor_of(d->'starts'))
         WHERE name = d->>'name';
    END IF;
    RETURN kept;
END
$$;
