-- The writers' status cursor becomes a transaction id. A cursor over
-- application_state.seq can skip a row: sequence numbers are taken before commit,
-- so a transaction that got its id first can commit a higher seq while a younger
-- one, holding a lower seq, is still open. Every transaction older than a
-- snapshot's xmin has finished and is visible in that snapshot, so a cursor over
-- changed_xid that never passes the reader's xmin misses nothing.
-- status_seq was never read by a released binary, so it goes in the same step.

ALTER TABLE writer_shard ADD COLUMN status_xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE writer_shard DROP COLUMN status_seq;

-- The status feed reads rows changed by transactions at or after a shard's cursor.
CREATE INDEX application_state_changed_xid_idx ON application_state (changed_xid);
