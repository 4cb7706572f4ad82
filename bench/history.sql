-- A large history for the recovery figure of scripts/bench, written straight
-- into the tables a leader would have written (schema of migrations/*.sql):
-- :finished completed jobs (accepted, started and completed events each) and
-- :open open ones (80 % pending, 20 % running on four workers), after a term
-- event of an old leader. Run on a migrated, empty database with
--   psql -v finished=1000000 -v open=10000 -f bench/history.sql
-- The leader would write the work rows with the events; they are inserted in
-- bulk instead, in the same transaction, with the triggers off for this
-- session (session_replication_role = replica). The events are staged in a
-- temporary table and written as log records of 48 events (about the 7 kB a
-- leader's record holds, record.h). Everything goes into part 0, which the
-- migrations create.
\set ON_ERROR_STOP on
BEGIN;
SET LOCAL session_replication_role = replica;

-- seq 1: the old leader's term. Work item i (1-based) of the history gets
-- seqs 3i-1 (accepted), 3i (started), 3i+1 (completed); open item k follows.
CREATE TEMP TABLE bench_t AS SELECT now() - interval '1 day' AS t0,
       (extract(epoch FROM now()) * 1000)::bigint + 3600000 AS deadline_ms;
CREATE TEMP TABLE bench_ev (seq bigint, term bigint, at timestamptz, type text, version int,
                            work_id text, data jsonb, part int);

INSERT INTO bench_ev (seq, term, at, type, version, work_id, data, part)
SELECT 1, 1, t0, 'term', 1, NULL, '{"term": 1, "leader": "http://127.0.0.1:9"}'::jsonb, 0 FROM bench_t;
INSERT INTO workd_leader (id, term, url, since)
SELECT 1, 1, 'http://127.0.0.1:9', t0 FROM bench_t;

-- The finished history.
INSERT INTO bench_ev (seq, term, at, type, version, work_id, data, part)
SELECT 3 * i - 1 + k, 1, t0 + (i * interval '50 microseconds') + k * interval '1 millisecond',
       CASE k WHEN 0 THEN 'accepted' WHEN 1 THEN 'started' ELSE 'completed' END, 1, 'h-' || i,
       CASE k
         WHEN 0 THEN jsonb_build_object('queue', 'default', 'priority', 0, 'payload', i,
                                        'run_at', NULL, 'timeout_ms', 60000, 'max_attempts', 3)
         WHEN 1 THEN jsonb_build_object('attempt', 1, 'worker_id', 'old-worker',
                                        'deadline', (extract(epoch FROM t0) * 1000)::bigint + 70000)
         ELSE '{"attempt": 1, "result": null, "queue": "default"}'::jsonb
       END, 0
FROM bench_t, generate_series(1, :finished) AS i, generate_series(0, 2) AS k;

INSERT INTO workd_done (id, queue, priority, payload, status, attempts, max_attempts, timeout_ms,
                        created_at, accepted_seq, started_at, finished_at, worker_id, result,
                        last_error, finished_seq, part, history)
SELECT 'h-' || i, 'default', 0, to_jsonb(i), 'completed', 1, 3, 60000,
       t0 + (i * interval '50 microseconds'), 3 * i - 1,
       t0 + (i * interval '50 microseconds') + interval '1 millisecond',
       t0 + (i * interval '50 microseconds') + interval '2 milliseconds', 'old-worker',
       'null'::jsonb, NULL, 3 * i + 1, 0, ARRAY[3 * i - 1, 3 * i, 3 * i + 1]::bigint[]
FROM bench_t, generate_series(1, :finished) AS i;

-- The open work: item k has seq base + 2k - 1 (accepted) and, if running,
-- base + 2k (started).
CREATE TEMP TABLE bench_open AS
SELECT k, 'o-' || k AS id, 3 * :finished + 1 + 2 * k - 1 AS acc_seq,
       k % 5 = 0 AS running, 'old-worker-' || (k % 4) AS worker
FROM generate_series(1, :open) AS k;

INSERT INTO bench_ev (seq, term, at, type, version, work_id, data, part)
SELECT acc_seq, 1, now() - interval '1 minute', 'accepted', 1, id,
       jsonb_build_object('queue', 'default', 'priority', 0, 'payload', k, 'run_at', NULL,
                          'timeout_ms', 3600000, 'max_attempts', 3), 0
FROM bench_open
UNION ALL
SELECT acc_seq + 1, 1, now() - interval '30 seconds', 'started', 1, id,
       jsonb_build_object('attempt', 1, 'worker_id', worker, 'deadline', deadline_ms), 0
FROM bench_open, bench_t WHERE running;

INSERT INTO workd_open (id, queue, priority, payload, status, attempts, max_attempts, timeout_ms,
                        run_at, created_at, accepted_seq, started_at, worker_id, deadline,
                        updated_seq, history)
SELECT id, 'default', 0, to_jsonb(k), CASE WHEN running THEN 'running' ELSE 'pending' END,
       CASE WHEN running THEN 1 ELSE 0 END, 3, 3600000, NULL, now() - interval '1 minute',
       acc_seq, CASE WHEN running THEN now() - interval '30 seconds' END,
       CASE WHEN running THEN worker END,
       CASE WHEN running THEN to_timestamp(deadline_ms / 1000.0) END,
       CASE WHEN running THEN acc_seq + 1 ELSE acc_seq END,
       CASE WHEN running THEN ARRAY[acc_seq, acc_seq + 1] ELSE ARRAY[acc_seq] END::bigint[]
FROM bench_open, bench_t;

INSERT INTO workd_log (first_seq, last_seq, term, last_at, control, events, part)
SELECT min(seq), max(seq), 1, max(at), false,
       string_agg(workd_log_line(seq, workd_epoch_ms(at), type, version, work_id, data), E'\n'
                  ORDER BY seq), 0
FROM bench_ev GROUP BY seq / 48;

COMMIT;
-- Vacuumed and analysed, as a database that has run for a while would be:
-- otherwise autovacuum works through the bulk load during the figure taken next.
VACUUM (ANALYZE) workd_log;
VACUUM (ANALYZE) workd_open;
VACUUM (ANALYZE) workd_done;
CHECKPOINT;
SELECT (SELECT sum(length(events) - length(replace(events, E'\n', '')) + 1) FROM workd_log)
         AS events,
       (SELECT count(*) FROM workd_open WHERE status IN ('pending', 'running')) AS open,
       (SELECT count(*) FROM workd_done WHERE status = 'completed') AS finished;
