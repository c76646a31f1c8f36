-- The writer's status feed reads, for each tenant of one of its shards, the state rows
-- changed since the shard's cursor (shared/src/db/status_feed.rs). Until now it joined
-- every application of the shard to its state and dropped the unchanged ones after: a
-- read cost the whole shard (about 2,100 buffers at 10,000 tenants) to return a few
-- dozen rows. With these indexes each tenant is one probe past the cursor.
CREATE INDEX application_state_tenant_xid_idx ON application_state (tenant_id, changed_xid);
CREATE INDEX resource_state_tenant_xid_idx ON resource_state (tenant_id, changed_xid);
