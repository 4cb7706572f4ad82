-- workd schema, version 9: every part refuses UPDATE and DELETE as a statement,
-- not only row by row: an empty part (made ahead of the clock) changes nothing
-- under an UPDATE, but the statement is refused all the same, as on the parent.
CREATE OR REPLACE FUNCTION workd_part_protect(t text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %I', t || '_no_truncate', t);
    EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE OR TRUNCATE ON %I '
                   'FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only()',
                   t || '_no_rewrite_stmt', t);
END
$$;

CREATE TRIGGER workd_events_no_rewrite_stmt BEFORE UPDATE OR DELETE ON workd_events
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();
CREATE TRIGGER workd_done_no_rewrite_stmt BEFORE UPDATE OR DELETE ON workd_done
    FOR EACH STATEMENT EXECUTE FUNCTION workd_events_append_only();

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent IN ('workd_events'::regclass, 'workd_done'::regclass) LOOP
        PERFORM workd_part_protect(r.relname);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION workd_part_add(p integer, s timestamptz, e timestamptz) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['workd_events', 'workd_done'] LOOP
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS, CHECK (part = %s))',
                       t || '_p' || p, t, p);
        PERFORM workd_part_protect(t || '_p' || p);
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                       t, t || '_p' || p, p, p + 1);
    END LOOP;
    INSERT INTO workd_parts (part, starts_at, ends_at) VALUES (p, s, e);
END
$$;
