-- Throughput over the last hour, per instance and minute: operations completed (from
-- operation_history) and failed (dead letters, still in operation), and the median
-- and worst time from enqueue to claim (milliseconds).
-- Run: psql "$DATABASE_URL" -f sql/inspect/throughput_last_hour.sql
SELECT i.name AS instance,
       date_trunc('minute', f.completed_at) AS minute,
       count(*) FILTER (WHERE f.state = 'completed') AS completed,
       count(*) FILTER (WHERE f.state = 'failed') AS failed,
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM f.claimed_at - f.created_at)) * 1000)::numeric, 1) AS claim_lag_p50_ms,
       round((max(extract(epoch FROM f.claimed_at - f.created_at)) * 1000)::numeric, 1) AS claim_lag_max_ms
  FROM (SELECT h.engine_instance_id, h.state, h.created_at, h.claimed_at, h.completed_at
          FROM operation_history h
         WHERE h.state = 'completed' AND h.completed_at > now() - interval '1 hour'
        UNION ALL
        SELECT o.engine_instance_id, o.state, o.created_at, o.claimed_at, o.completed_at
          FROM operation o
         WHERE o.state = 'failed' AND o.completed_at > now() - interval '1 hour') AS f
  JOIN engine_instance i ON i.id = f.engine_instance_id
 GROUP BY i.name, date_trunc('minute', f.completed_at)
 ORDER BY instance, minute;
