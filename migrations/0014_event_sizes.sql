-- workd schema, version 14: every event records the size of its data as text.
--
-- A results stream catching up from the table reads pages of about a byte
-- budget, and chose the events of a page by their stored size: compressed, a
-- 1 MB result of repetitive text stores as 12 kB, so a page converted to text
-- some eighty such events to send one (0.5 s per event, 2026-11-23). The
-- leader writes the length of the JSON text it appends; rows from before keep
-- NULL and their stored size is used (journal_finished_after).
ALTER TABLE workd_events ADD COLUMN data_bytes integer;
