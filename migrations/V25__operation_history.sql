-- Finished operations leave the queue table. An operation that completes, or that a
-- newer waiting operation of its resource supersedes, is deleted from `operation` and
-- its record is written here in the same statement; dead letters stay in `operation`,
-- where an operator retries or discards them.
--
-- Why: the claim reads `operation` (its waiting and claimed partial indexes, its
-- heap). Kept there for their day of retention, finished rows made that table hold
-- every operation of the last day, and each completion wrote one more version of a
-- row the claim had just read. Here a finished operation costs the queue one delete;
-- its record is an insert into a table that only grows at its end and is pruned
-- from its start, which no claim reads.
CREATE TABLE operation_history (
    id bigint PRIMARY KEY,
    engine_instance_id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_type resource_type NOT NULL,
    resource_id bigint NOT NULL,
    state operation_state NOT NULL CHECK (state IN ('completed', 'superseded')),
    attempts integer NOT NULL DEFAULT 0,
    lease_expiries integer NOT NULL DEFAULT 0,
    claimed_by text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_at timestamptz,
    completed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The last error it met (a superseded one's, or why it was superseded).
    operator_error text
);

-- Pruning by age, and the inspect queries' recent history.
CREATE INDEX operation_history_completed_idx ON operation_history (completed_at);

-- What was finished before moves over, oldest first. Expand only: agents of the
-- release before go on completing into `operation` while the new ones roll out, so
-- nothing here forbids that or takes a lock they would wait behind (no constraint on
-- `operation`, no index dropped); the new agents prune such rows from `operation`
-- as the old ones did, and a later release contracts.
WITH moved AS (
    DELETE FROM operation
     WHERE state IN ('completed', 'superseded')
    RETURNING id, engine_instance_id, tenant_id, resource_type, resource_id, state, attempts, lease_expiries,
              claimed_by, created_at, claimed_at, completed_at, operator_error
)
INSERT INTO operation_history (id, engine_instance_id, tenant_id, resource_type, resource_id, state, attempts,
                               lease_expiries, claimed_by, created_at, claimed_at, completed_at, operator_error)
SELECT id, engine_instance_id, tenant_id, resource_type, resource_id, state, attempts, lease_expiries,
       claimed_by, created_at, claimed_at, coalesce(completed_at, created_at), operator_error
  FROM moved
 ORDER BY id;


-- Every operation the queue knows, in flight, dead-lettered or finished, for an
-- operator asking what became of one (`SELECT * FROM operation_log WHERE id = …`).
-- What only an unfinished operation has is NULL for a finished one.
CREATE VIEW operation_log AS
SELECT id, engine_instance_id, tenant_id, resource_type, resource_id, state, attempts, lease_expiries,
       claimed_by, created_at, claimed_at, completed_at, operator_error, tenant_message,
       run_after, lease_token, lease_expires_at, queue_key
  FROM operation
UNION ALL
SELECT id, engine_instance_id, tenant_id, resource_type, resource_id, state, attempts, lease_expiries,
       claimed_by, created_at, claimed_at, completed_at, operator_error, NULL,
       NULL, NULL, NULL, NULL
  FROM operation_history;
