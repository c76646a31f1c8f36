-- Status rows a writer could not patch because of their own resource (the API server
-- refused that object, or it kept changing under the patch). The writer's cursor
-- passes them, so one resource never holds back the status of the others in its
-- shard; each is recorded here in the transaction that moves the cursor, and put
-- back in the feed (its state row stamped again) when `due_at` comes, with a delay
-- that doubles per attempt up to a minute. A patch that succeeds, or finds the
-- object gone, deletes the row. See writer/src/status and sql/README.md.
CREATE TABLE status_retry (
    kind       text        NOT NULL
               CHECK (kind IN ('application', 'managed_environment', 'repository_credential')),
    -- application.id, managed_environment.id or repository_credential.id.
    row_id     bigint      NOT NULL,
    -- The shard whose owner puts it back in the feed (the tenant's, when recorded).
    shard      integer     NOT NULL,
    attempts   integer     NOT NULL DEFAULT 1,
    due_at     timestamptz NOT NULL,
    -- The last failure, for operators (the resource's name and the API's answer).
    last_error text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, row_id)
);
CREATE INDEX status_retry_shard_idx ON status_retry (shard, due_at);

-- How long after its `attempts`-th failure a row is tried again: 1 s, doubling, at
-- most 60 s.
CREATE FUNCTION status_retry_delay(p_attempts integer) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN make_interval(secs => LEAST(60, power(2, LEAST(GREATEST(p_attempts, 1) - 1, 6))));
