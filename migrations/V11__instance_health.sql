-- An engine instance's health, from what its agents report:
-- heartbeat_at: an agent reached the Argo CD namespace's API (written only then);
-- progress_at:  an agent saw Argo CD's application controller refresh the
--               service-owned probe Application (its reconciledAt moved).
-- engine_instance_health() turns them into healthy, degraded (the API answers, Argo
-- CD is stuck) or lost (no agent reaches the API). The windows span several probes
-- (agents probe every 15 s), so one late probe changes nothing; operators may set
-- them per database or role: gitops.instance_lost_after (default 60 seconds) and
-- gitops.instance_degraded_after (default 90 seconds). An agent that never
-- reported progress (an older agent) is judged on its heartbeat alone.

ALTER TABLE engine_instance ADD COLUMN progress_at timestamptz;

CREATE FUNCTION engine_instance_health(heartbeat_at timestamptz, progress_at timestamptz) RETURNS text
    LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN heartbeat_at IS NULL
          OR heartbeat_at < now() - COALESCE(NULLIF(current_setting('gitops.instance_lost_after', true), ''),
                                             '60 seconds')::interval THEN 'lost'
        WHEN progress_at IS NOT NULL
         AND progress_at < now() - COALESCE(NULLIF(current_setting('gitops.instance_degraded_after', true), ''),
                                            '90 seconds')::interval THEN 'degraded'
        ELSE 'healthy'
    END
$$;
