-- workd schema, version 8: finished counts per part (GET /queues), kept by the
-- leader's append as it writes finished work, so that no read counts the
-- history; a part's counts leave with it.
CREATE TABLE workd_counts (
    part   integer NOT NULL,
    queue  text    NOT NULL,
    status text    NOT NULL,  -- completed, cancelled
    n      bigint  NOT NULL,
    PRIMARY KEY (part, queue, status)
);
INSERT INTO workd_counts (part, queue, status, n)
SELECT part, queue, status, count(*) FROM workd_done GROUP BY part, queue, status;
