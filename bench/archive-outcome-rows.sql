-- The archive rows a handled message adds beside its own: one handled row and one reply
-- row (a short text reply), as internal/archive OutcomeRows writes them; 200 000 of each,
-- the table and indexes measured, the schema dropped. psql -f bench/archive-outcome-rows.sql
DROP SCHEMA IF EXISTS outcome_size CASCADE;
CREATE SCHEMA outcome_size;
SET search_path = outcome_size;
CREATE TABLE kf_archive (
	at timestamptz NOT NULL, msgid text NOT NULL, kind text NOT NULL, seq integer NOT NULL DEFAULT 0,
	open_kfid text NOT NULL, external_userid text NOT NULL, msg_type text NOT NULL DEFAULT '',
	origin smallint NOT NULL DEFAULT 0, servicer_userid text NOT NULL DEFAULT '', reason text NOT NULL DEFAULT '',
	detail text NOT NULL DEFAULT '', content bytea, src_partition integer NOT NULL DEFAULT -1,
	src_offset bigint NOT NULL DEFAULT -1, recorded timestamptz NOT NULL, PRIMARY KEY (msgid, kind, seq, at));
CREATE INDEX ON kf_archive (external_userid, at);
CREATE INDEX ON kf_archive (open_kfid, at);
INSERT INTO kf_archive SELECT now() - make_interval(secs => g), 'bench-b-' || lpad(g::text, 10, '0'), 'handled', 0, 'wkBench',
  'wmUser' || lpad((g % 100000)::text, 7, '0'), '', 0, '', '', '', NULL, g % 12, g, now() FROM generate_series(1, 200000) g;
INSERT INTO kf_archive SELECT now() - make_interval(secs => g), 'bench-b-' || lpad(g::text, 10, '0'), 'reply', 0, 'wkBench',
  'wmUser' || lpad((g % 100000)::text, 7, '0'), 'text', 10, '', 'sent', '',
  convert_to('{"msgtype":"text","text":{"content":"Thanks, your parcel left today."}}', 'UTF8'), g % 12, g, now() FROM generate_series(1, 200000) g;
SELECT kind, count(*) FROM kf_archive GROUP BY kind;
SELECT round(pg_table_size('kf_archive')::numeric / 200000, 1) AS table_b_per_msg, round(pg_indexes_size('kf_archive')::numeric / 200000, 1) AS index_b_per_msg;
DROP SCHEMA outcome_size CASCADE;
