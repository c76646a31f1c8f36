-- Throughput over the last hour, per instance and minute: operations completed and
-- failed, and the median and worst time from enqueue to claim (milliseconds).
-- Run: psql "$DATABASE_URL" -f sql/inspect/throughput_last_hour.sql
SELECT i.name AS instance,
       date_trunc('minute', o.completed_at) AS minute,
       count(*) FILTER (WHERE o.state = 'completed') AS completed,
       count(*) FILTER (WHERE o.state = 'failed') AS failed,
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM o.claimed_at - o.created_at)) * 1000)::numeric, 1) AS claim_lag_p50_ms,
       round((max(extract(epoch FROM o.claimed_at - o.created_at)) * 1000)::numeric, 1) AS claim_lag_max_ms
  FROM operation o
  JOIN engine_instance i ON i.id = o.engine_instance_id
 WHERE o.completed_at > now() - interval '1 hour'
   AND o.state IN ('completed', 'failed')
 GROUP BY i.name, date_trunc('minute', o.completed_at)
 ORDER BY instance, minute;
