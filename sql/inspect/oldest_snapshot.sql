-- Who holds this database's oldest snapshot (its xmin horizon): while it is held,
-- nothing the queue leaves behind can be cleaned up. Empty: nobody. Counted: sessions
-- of this database with a snapshot or a transaction id, walsenders (standby feedback),
-- replication slots' xmin (not catalog_xmin) and this database's prepared
-- transactions; the oldest by age in XIDs. One statement: it leaves no transaction
-- open. The agent samples it (gitops_agent_xmin_horizon_age_*), gitopsctl queue shows it.
-- Run: psql "$DATABASE_URL" -f sql/inspect/oldest_snapshot.sql
WITH holders AS (
    SELECT CASE WHEN a.backend_type = 'walsender' THEN 'walsender' ELSE 'session' END AS kind,
           a.pid, a.application_name AS name, host(a.client_addr) AS client, a.usename::text AS role,
           a.state,
           greatest(age(a.backend_xmin), age(a.backend_xid)) AS age_xids,
           extract(epoch FROM now() - a.xact_start)::float8 AS age_s
      FROM pg_stat_activity a
     WHERE (a.datname = current_database() OR a.backend_type = 'walsender')
       AND a.pid <> pg_backend_pid()
       AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
    UNION ALL
    SELECT 'replication slot', s.active_pid, s.slot_name::text, NULL, NULL,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           age(s.xmin), NULL
      FROM pg_replication_slots s
     WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', NULL, p.gid, NULL, p.owner::text, 'prepared',
           age(p.transaction), extract(epoch FROM now() - p.prepared)::float8
      FROM pg_prepared_xacts p
     WHERE p.database = current_database()
)
SELECT kind, pid, name, client, role, state, age_xids, age_s
  FROM holders
 ORDER BY age_xids DESC, age_s DESC NULLS LAST
 LIMIT 1
