-- For a DBA, once per database server (migrations create no roles): a role for
-- people who look at the queue with psql, that cannot pin the database's xmin horizon
-- for long, and what the service's own role needs to name whoever does.
-- Run as a superuser (or a role with CREATEROLE and the grants below), after
-- replacing the names in angle brackets:
--   psql "$ADMIN_DATABASE_URL" -v ON_ERROR_STOP=1 -f sql/dba/inspection_role.sql

-- An inspection role: reads everything, writes nothing. A session of it left in a
-- transaction (an open BEGIN, a REPEATABLE READ look, a cursor) is ended after five
-- minutes idle, and no statement of it runs longer than a minute: while either lasts,
-- no row version the service leaves behind can be cleaned up, and its tables grow.
CREATE ROLE gitops_inspect LOGIN PASSWORD '<password>';
GRANT CONNECT ON DATABASE <database> TO gitops_inspect;
GRANT USAGE ON SCHEMA public TO gitops_inspect;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO gitops_inspect;
ALTER DEFAULT PRIVILEGES FOR ROLE <service_role> IN SCHEMA public GRANT SELECT ON TABLES TO gitops_inspect;
ALTER ROLE gitops_inspect SET idle_in_transaction_session_timeout = '5min';
ALTER ROLE gitops_inspect SET statement_timeout = '1min';
ALTER ROLE gitops_inspect SET default_transaction_read_only = on;

-- The service's role: without pg_read_all_stats, other roles' sessions show no state,
-- client address or transaction start in pg_stat_activity, so the agent's
-- gitops_agent_xmin_horizon_age_seconds and `gitopsctl queue` cannot tell how long
-- they have held their snapshot (their age in XIDs is still shown).
GRANT pg_read_all_stats TO <service_role>;

-- Standbys hold back the primary's horizon too when they send feedback. On a standby
-- that serves long reports, prefer leaving feedback off and letting the report be
-- cancelled (max_standby_streaming_delay), or bound what the primary keeps for it:
--   ALTER SYSTEM SET hot_standby_feedback = off;           -- on the standby
--   ALTER SYSTEM SET max_standby_streaming_delay = '30s';  -- on the standby
-- A replication slot nobody reads any more pins the horizon for ever: drop it.
--   SELECT slot_name, active, age(xmin) FROM pg_replication_slots WHERE xmin IS NOT NULL;
--   SELECT pg_drop_replication_slot('<slot_name>');
