-- workd schema, version 21: a shard's rows in a database of its own.
--
-- A cluster's home database (--database-url) keeps the cluster's own tables
-- (nodes, subscriptions, the shard count) and the rows of every shard that
-- has no database of its own. A shard given one (--shard-databases) keeps its
-- leader lock, term, fence, log, work, inbox, schedules and batches there,
-- on a PostgreSQL of its own. Every database of a cluster has the whole
-- schema and says here which database it is, which cluster it belongs to,
-- and (a shard's database) whose rows it keeps; the home database says where
-- each such shard lives. A shard's database is chosen before its first
-- leader and never changes (the server refuses a setting that moves one).

-- This database's own id, and the home database's id (NULL: this is a home
-- database); keeps: the shards whose rows a shard's database keeps.
ALTER TABLE workd_cluster
    ADD COLUMN database uuid NOT NULL DEFAULT gen_random_uuid(),
    ADD COLUMN home     uuid,
    ADD COLUMN keeps    integer[];

-- In the home database: the shards that live in a database of their own.
CREATE TABLE workd_shard_databases (
    shard    integer     PRIMARY KEY CHECK (shard BETWEEN 1 AND 63),
    database uuid        NOT NULL, -- that database's workd_cluster.database
    since    timestamptz NOT NULL DEFAULT now()
);

-- Work submitted in SQL goes to its queue's shard, and only in the database
-- that keeps that shard's rows: elsewhere no leader would ever read it.
CREATE OR REPLACE FUNCTION workd_inbox_shard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c public.workd_cluster;
BEGIN
    NEW.shard := public.workd_shard_of(NEW.queue);
    SELECT * INTO c FROM public.workd_cluster WHERE id = 1;
    IF (c.home IS NULL AND EXISTS (SELECT 1 FROM public.workd_shard_databases d
                                    WHERE d.shard = NEW.shard))
       OR (c.home IS NOT NULL AND NOT NEW.shard = ANY (coalesce(c.keeps, '{}'))) THEN
        RAISE EXCEPTION 'queue % belongs to shard %, whose work this database does not keep',
                        NEW.queue, NEW.shard
            USING ERRCODE = '22023',
                  HINT = 'call workd.submit in the database of that shard (--shard-databases)';
    END IF;
    RETURN NEW;
END
$$;
