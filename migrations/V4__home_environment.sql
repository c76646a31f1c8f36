-- A tenant's own namespace as a destination goes through credentials the writer
-- makes for that namespace alone (a ServiceAccount bound to a namespace Role, its
-- token from TokenRequest). They are stored as a managed environment of the tenant
-- marked `home`, keyed by the namespace's UID, so the agent handles them exactly
-- like a tenant's own environment: one cluster Secret, one project destination.
-- Tenants cannot name it: deployments resolve environment names among non-home rows.

ALTER TABLE managed_environment ADD COLUMN home boolean NOT NULL DEFAULT false;

-- At most one live home environment per tenant.
CREATE UNIQUE INDEX managed_environment_home_idx ON managed_environment (tenant_id)
    WHERE home AND row_state = 'active';

-- When the stored credential stops working (a TokenRequest token's expiry); the
-- writer requests a new token well before. NULL: credentials without an expiry.
ALTER TABLE cluster_credential ADD COLUMN expires_at timestamptz;

-- The refresh scan: home credentials by expiry.
CREATE INDEX cluster_credential_expires_idx ON cluster_credential (expires_at)
    WHERE expires_at IS NOT NULL;
