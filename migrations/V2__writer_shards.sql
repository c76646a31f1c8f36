-- Writer coordination. Tenant namespaces are spread over a fixed set of shards;
-- each shard has at most one owning writer at a time (a lease, like the queue's),
-- so several writer replicas never race on one namespace, and ownership moves when
-- a writer stops renewing. Each shard also keeps the writer's durable cursor over
-- application_state.seq, so a new owner resumes where the last one stopped.

CREATE TABLE writer_shard (
    shard             integer     PRIMARY KEY CHECK (shard >= 0),
    writer_id         text,
    lease_expires_at  timestamptz,
    status_seq        bigint      NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((writer_id IS NULL) = (lease_expires_at IS NULL))
);

INSERT INTO writer_shard (shard) SELECT generate_series(0, 63);

-- The shard of a tenant's namespace, written by the writer when it creates the
-- tenant (FNV-1a of the namespace name modulo the number of shards; see the
-- writer's shard module). Nullable so that this migration expands only.
ALTER TABLE tenant ADD COLUMN writer_shard integer;
CREATE INDEX tenant_writer_shard_idx ON tenant (writer_shard);
