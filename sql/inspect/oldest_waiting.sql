-- Oldest waiting operations: the 20 that have waited longest to be claimed, with
-- their instance, resource and how many attempts they have used.
-- Run: psql "$DATABASE_URL" -f sql/inspect/oldest_waiting.sql
SELECT o.id, i.name AS instance, o.resource_type, o.resource_id, o.tenant_id, o.attempts,
       round(extract(epoch FROM now() - o.created_at)::numeric, 1) AS waiting_s,
       o.run_after > now() AS backing_off,
       o.operator_error AS last_error
  FROM operation o
  JOIN engine_instance i ON i.id = o.engine_instance_id
 WHERE o.state = 'waiting'
 ORDER BY o.created_at
 LIMIT 20;
