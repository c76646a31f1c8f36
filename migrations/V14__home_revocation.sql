-- Failover replaces the home identity of every tenant it moves off a lost
-- instance: the lost instance's Argo CD may still hold the tenant's home token, and
-- only recreating the ServiceAccount makes that token stop working. The failover
-- step marks the tenant's home environment in its transaction; a writer deletes the
-- ServiceAccount (its identity watch makes it again, with a new token that goes to
-- the tenant's new instance) and clears the mark. A crash in between only repeats
-- the deletion.

ALTER TABLE managed_environment ADD COLUMN home_revoke_requested_at timestamptz;

CREATE INDEX managed_environment_home_revoke_idx ON managed_environment (home_revoke_requested_at)
    WHERE home_revoke_requested_at IS NOT NULL;
