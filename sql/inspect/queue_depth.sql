-- Queue depth: how many operations each engine instance has waiting, claimed and
-- failed, and the age of the oldest one (seconds since it was enqueued). Finished
-- operations are in operation_history (throughput_last_hour.sql reads them).
-- Run: psql "$DATABASE_URL" -f sql/inspect/queue_depth.sql
SELECT i.name AS instance,
       o.state,
       count(*) AS operations,
       round(extract(epoch FROM now() - min(o.created_at))::numeric, 1)::float8 AS oldest_age_s
  FROM operation o
  JOIN engine_instance i ON i.id = o.engine_instance_id
 GROUP BY i.name, o.state
 ORDER BY i.name, o.state;
