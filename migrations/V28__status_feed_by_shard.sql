-- A state row carries its tenant's writer shard, so the status feed reads one index
-- range per shard.
--
-- Since V23 the writer's status feed (shared/src/db/status_feed.rs) probed every
-- tenant of the shard for state rows changed past the cursor: one probe into each of
-- two indexes per tenant, whether or not anything changed. At 10,000 tenants over 64
-- shards that is about 700 buffers a read, and `bench e2e --tenants 10000
-- --deployments 25000` spent 46% of its statement time in that read while statuses
-- came back. Indexed by (writer_shard, changed_xid), a read walks only the rows past
-- the cursor, in the order it returns them.
--
-- The shard is the tenant's (tenant.writer_shard): state_writer_shard() copies it on
-- every insert and update of a state row, and tenant_writer_shard_moved() touches a
-- tenant's state rows when its shard changes, which also stamps them with a new
-- changed_xid so that the new shard's reader, whose cursor may be past their old one,
-- reads them. A tenant's shard is recorded in the writer's tenancy transaction, before
-- any of its resources (and so any state row) is written, and never changes after
-- (it is a function of the namespace's name). Were a state write ever in flight while
-- the shard changed, the row would keep the old shard until its next write: the old
-- shard's writer would carry that status instead, so nothing is lost.
--
-- The backfill touches every state row, so each is read once more by the feed;
-- a writer patches only what differs from the tenant's resource, so that costs reads,
-- not writes. application_state_changed_xid_idx and resource_state_changed_xid_idx
-- have had no reader since V23 and go; the (tenant_id, changed_xid) indexes stay for
-- the statements that select a tenant's state rows (moves, purge).

ALTER TABLE application_state ADD COLUMN writer_shard integer;
ALTER TABLE resource_state ADD COLUMN writer_shard integer;

CREATE FUNCTION state_writer_shard() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.writer_shard := (SELECT writer_shard FROM tenant WHERE id = NEW.tenant_id);
    RETURN NEW;
END;
$$;

CREATE TRIGGER application_state_writer_shard BEFORE INSERT OR UPDATE ON application_state
    FOR EACH ROW EXECUTE FUNCTION state_writer_shard();
CREATE TRIGGER resource_state_writer_shard BEFORE INSERT OR UPDATE ON resource_state
    FOR EACH ROW EXECUTE FUNCTION state_writer_shard();

CREATE FUNCTION tenant_writer_shard_moved() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    UPDATE application_state SET updated_at = now() WHERE tenant_id = NEW.id;
    UPDATE resource_state SET updated_at = now() WHERE tenant_id = NEW.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER tenant_writer_shard_moved AFTER UPDATE OF writer_shard ON tenant
    FOR EACH ROW WHEN (OLD.writer_shard IS DISTINCT FROM NEW.writer_shard)
    EXECUTE FUNCTION tenant_writer_shard_moved();

-- The backfill (through state_writer_shard()).
UPDATE application_state SET updated_at = updated_at;
UPDATE resource_state SET updated_at = updated_at;

CREATE INDEX application_state_shard_xid_idx ON application_state (writer_shard, changed_xid, seq);
CREATE INDEX resource_state_shard_xid_idx ON resource_state (writer_shard, changed_xid, seq);

DROP INDEX application_state_changed_xid_idx;
DROP INDEX resource_state_changed_xid_idx;
