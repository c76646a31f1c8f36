-- Failover of a lost engine instance. A lost instance cannot release its tenants,
-- so it is fenced first: its epoch is bumped and fenced_at set (it is cordoned too),
-- then its tenants are placed on healthy instances, which adopt them directly
-- (move_state 'adopting', move_reason 'failover'). Its agents see the fence when
-- they reach the database again: before anything else they remove, without
-- pruning, every Argo CD object of tenants no longer placed on it, then clear
-- fenced_at; the instance rejoins cordoned.

ALTER TABLE engine_instance
    ADD COLUMN epoch     bigint NOT NULL DEFAULT 0,
    ADD COLUMN fenced_at timestamptz;
