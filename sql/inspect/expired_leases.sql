-- Expired leases: claimed operations whose holder did not finish or renew in time
-- (a crashed or stalled agent). Agents reclaim these on their own within seconds;
-- rows that stay here mean no agent of that instance is running.
-- Run: psql "$DATABASE_URL" -f sql/inspect/expired_leases.sql
SELECT o.id, i.name AS instance, o.claimed_by, o.resource_type, o.resource_id, o.attempts,
       round(extract(epoch FROM now() - o.lease_expires_at)::numeric, 1) AS expired_for_s
  FROM operation o
  JOIN engine_instance i ON i.id = o.engine_instance_id
 WHERE o.state = 'claimed' AND o.lease_expires_at < now()
 ORDER BY o.lease_expires_at;
