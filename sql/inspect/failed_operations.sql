-- Failed operations (the dead letters): what failed, the full error for operators and
-- the message the tenant sees. Revive with `gitopsctl queue retry ID` or
-- `gitopsctl queue retry --all-failed`.
-- Run: psql "$DATABASE_URL" -f sql/inspect/failed_operations.sql
SELECT o.id, i.name AS instance, o.resource_type, o.resource_id, o.tenant_id, o.attempts,
       o.completed_at AS failed_at, o.operator_error, o.tenant_message
  FROM operation o
  JOIN engine_instance i ON i.id = o.engine_instance_id
 WHERE o.state = 'failed'
 ORDER BY o.completed_at DESC;
