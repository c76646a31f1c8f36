-- The initial schema: tenants, engine instances, tenant intent, observed state,
-- the operation queue and the signal mechanism. sql/README.md is the contract for
-- every table and column below; keep the two in step.

-- States are enums so psql shows words, not numbers. Binaries decode values they do
-- not know as "unknown", so a later migration may add values (expand, then contract).
CREATE TYPE row_state AS ENUM ('active', 'deleting', 'deleted');
CREATE TYPE resource_type AS ENUM (
    'application', 'managed_environment', 'repository_credential', 'sync_operation', 'tenant'
);
CREATE TYPE operation_state AS ENUM ('waiting', 'claimed', 'completed', 'failed', 'superseded');
CREATE TYPE sync_type AS ENUM ('automated', 'manual');
CREATE TYPE sync_operation_state AS ENUM (
    'pending', 'running', 'succeeded', 'failed', 'terminating', 'terminated'
);
CREATE TYPE signal_kind AS ENUM ('operations', 'status');

-- ---------------------------------------------------------------------------------
-- Signals: debounced wake-ups. One row per (kind, ref_id); the channel and the
-- advisory lock key are derived from the numbers (see signal_raise).
-- ---------------------------------------------------------------------------------
CREATE TABLE signal (
    kind        signal_kind NOT NULL,
    ref_id      bigint      NOT NULL CHECK (ref_id >= 0 AND ref_id < 281474976710656),
    sleeping    boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, ref_id)
);

CREATE FUNCTION signal_channel(p_kind signal_kind, p_ref bigint) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 'gitops_' || p_kind::text || '_' || p_ref::text;

CREATE FUNCTION signal_lock_key(p_kind signal_kind, p_ref bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    -- 0x67 ('g') in the top byte keeps the keys in a range of their own.
    RETURN (103::bigint << 56)
         | ((CASE p_kind WHEN 'operations' THEN 1 ELSE 2 END)::bigint << 48)
         | p_ref;

-- Called by every notifying trigger. Notifies only when a consumer may be asleep.
-- The shared advisory lock is held until the calling transaction ends; a consumer that
-- wants to sleep must take the same key exclusively (without waiting) to set
-- "sleeping", so it can only do so after this transaction has committed or rolled
-- back, and it scans once more after that. Each statement of this VOLATILE function
-- takes a fresh snapshot, so the read below happens after the lock is held.
CREATE FUNCTION signal_raise(p_kind signal_kind, p_ref bigint) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    v_sleeping boolean;
BEGIN
    -- Benchmark-only switch: measures the enqueue path without its signalling step.
    IF current_setting('gitops.bench_skip_signal', true) = 'on' THEN
        RETURN;
    END IF;
    -- Above READ COMMITTED the read below would use the transaction's first
    -- snapshot; notifying unconditionally keeps the guarantee there.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(signal_channel(p_kind, p_ref), '');
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(signal_lock_key(p_kind, p_ref));
    SELECT s.sleeping INTO v_sleeping FROM signal s WHERE s.kind = p_kind AND s.ref_id = p_ref;
    IF v_sleeping IS DISTINCT FROM false THEN
        PERFORM pg_notify(signal_channel(p_kind, p_ref), '');
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------
-- Engine instances (Argo CD instances), registered by an operator.
-- ---------------------------------------------------------------------------------
CREATE TABLE engine_instance (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              text        NOT NULL UNIQUE
                      CHECK (name ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    argocd_namespace  text        NOT NULL
                      CHECK (argocd_namespace ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    capacity          integer     NOT NULL DEFAULT 1000 CHECK (capacity > 0),
    heartbeat_at      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION engine_instance_signal_row() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO signal (kind, ref_id) VALUES ('operations', NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER engine_instance_signal_row AFTER INSERT ON engine_instance
    FOR EACH ROW EXECUTE FUNCTION engine_instance_signal_row();

-- ---------------------------------------------------------------------------------
-- Tenants: one per API namespace, identified by the namespace UID.
-- ---------------------------------------------------------------------------------
CREATE TABLE tenant (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace_uid       uuid        NOT NULL UNIQUE,
    namespace_name      text        NOT NULL,
    engine_instance_id  bigint      REFERENCES engine_instance (id),
    row_state           row_state   NOT NULL DEFAULT 'active',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenant_engine_instance_idx ON tenant (engine_instance_id);
CREATE INDEX tenant_namespace_name_idx ON tenant (namespace_name);

-- ---------------------------------------------------------------------------------
-- Tenant intent. Every row: tenant_id, the tenant resource's UID and generation.
-- ---------------------------------------------------------------------------------
CREATE TABLE managed_environment (
    id                              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id                       bigint      NOT NULL REFERENCES tenant (id),
    resource_uid                    uuid        NOT NULL UNIQUE,
    resource_name                   text        NOT NULL,
    generation                      bigint      NOT NULL,
    api_url                         text        NOT NULL,
    allow_insecure_skip_tls_verify  boolean     NOT NULL DEFAULT false,
    namespaces                      text[]      NOT NULL DEFAULT '{}',
    cluster_resources               boolean     NOT NULL DEFAULT false,
    row_state                       row_state   NOT NULL DEFAULT 'active',
    created_at                      timestamptz NOT NULL DEFAULT now(),
    updated_at                      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX managed_environment_tenant_idx ON managed_environment (tenant_id);

CREATE TABLE cluster_credential (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id               bigint      NOT NULL REFERENCES tenant (id),
    managed_environment_id  bigint      NOT NULL UNIQUE
                            REFERENCES managed_environment (id) ON DELETE CASCADE,
    secret_name             text        NOT NULL,
    secret_resource_version text,
    key_id                  text        NOT NULL,
    ciphertext              bytea       NOT NULL,
    updated_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cluster_credential_tenant_idx ON cluster_credential (tenant_id);

CREATE TABLE repository_credential (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id               bigint      NOT NULL REFERENCES tenant (id),
    resource_uid            uuid        NOT NULL UNIQUE,
    resource_name           text        NOT NULL,
    generation              bigint      NOT NULL,
    repo_url                text        NOT NULL,
    secret_name             text        NOT NULL,
    secret_resource_version text,
    key_id                  text,
    ciphertext              bytea,
    row_state               row_state   NOT NULL DEFAULT 'active',
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CHECK ((key_id IS NULL) = (ciphertext IS NULL))
);
CREATE INDEX repository_credential_tenant_idx ON repository_credential (tenant_id);

CREATE TABLE application (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id               bigint      NOT NULL REFERENCES tenant (id),
    resource_uid            uuid        NOT NULL UNIQUE,
    resource_name           text        NOT NULL,
    generation              bigint      NOT NULL,
    repo_url                text        NOT NULL,
    path                    text        NOT NULL,
    target_revision         text        NOT NULL DEFAULT 'HEAD',
    managed_environment_id  bigint      REFERENCES managed_environment (id),
    destination_namespace   text        NOT NULL,
    sync_type               sync_type   NOT NULL,
    create_namespace        boolean     NOT NULL DEFAULT false,
    wait_for_pruning        boolean     NOT NULL DEFAULT false,
    row_state               row_state   NOT NULL DEFAULT 'active',
    deletion_message        text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX application_tenant_idx ON application (tenant_id);
CREATE INDEX application_environment_idx ON application (managed_environment_id)
    WHERE managed_environment_id IS NOT NULL;

CREATE TABLE sync_operation (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id           bigint               NOT NULL REFERENCES tenant (id),
    resource_uid        uuid                 NOT NULL UNIQUE,
    resource_name       text                 NOT NULL,
    generation          bigint               NOT NULL,
    deployment_name     text                 NOT NULL,
    application_id      bigint               REFERENCES application (id),
    revision            text                 NOT NULL,
    correlation_id      uuid                 NOT NULL DEFAULT gen_random_uuid(),
    state               sync_operation_state NOT NULL DEFAULT 'pending',
    terminate_requested boolean              NOT NULL DEFAULT false,
    synced_revision     text,
    message             text,
    started_at          timestamptz,
    finished_at         timestamptz,
    row_state           row_state            NOT NULL DEFAULT 'active',
    created_at          timestamptz          NOT NULL DEFAULT now(),
    updated_at          timestamptz          NOT NULL DEFAULT now()
);
CREATE INDEX sync_operation_tenant_idx ON sync_operation (tenant_id);
CREATE INDEX sync_operation_application_idx ON sync_operation (application_id);

-- ---------------------------------------------------------------------------------
-- Observed state, written by agents. seq orders changes for the writer's cursor.
-- ---------------------------------------------------------------------------------
CREATE SEQUENCE application_state_seq;

CREATE TABLE application_state (
    application_id   bigint      PRIMARY KEY REFERENCES application (id) ON DELETE CASCADE,
    tenant_id        bigint      NOT NULL REFERENCES tenant (id),
    sync_status      text,
    sync_revision    text,
    health_status    text,
    health_message   text,
    resources        jsonb       NOT NULL DEFAULT '[]',
    conditions       jsonb       NOT NULL DEFAULT '[]',
    operation_state  jsonb,
    reconciled_state jsonb,
    seq              bigint      NOT NULL DEFAULT nextval('application_state_seq'),
    changed_xid      xid8        NOT NULL DEFAULT pg_current_xact_id(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX application_state_seq_idx ON application_state (seq);

-- Every change takes a new sequence number and records its transaction, so a reader
-- can keep a cursor without skipping rows committed out of sequence order.
CREATE FUNCTION application_state_stamp() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.seq := nextval('application_state_seq');
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END;
$$;

CREATE TRIGGER application_state_stamp BEFORE UPDATE ON application_state
    FOR EACH ROW EXECUTE FUNCTION application_state_stamp();

INSERT INTO signal (kind, ref_id) VALUES ('status', 0);

CREATE FUNCTION application_state_signal() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM signal_raise('status', 0);
    RETURN NULL;
END;
$$;

CREATE TRIGGER application_state_signal AFTER INSERT OR UPDATE ON application_state
    FOR EACH STATEMENT EXECUTE FUNCTION application_state_signal();

-- ---------------------------------------------------------------------------------
-- The operation queue (outbox). No payload: the agent reconciles to current rows.
-- ---------------------------------------------------------------------------------
CREATE TABLE operation (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    engine_instance_id  bigint          NOT NULL REFERENCES engine_instance (id),
    tenant_id           bigint          NOT NULL,
    resource_type       resource_type   NOT NULL,
    resource_id         bigint          NOT NULL,
    state               operation_state NOT NULL DEFAULT 'waiting',
    attempts            integer         NOT NULL DEFAULT 0,
    run_after           timestamptz     NOT NULL DEFAULT now(),
    claimed_by          text,
    lease_token         uuid,
    lease_expires_at    timestamptz,
    claimed_at          timestamptz,
    completed_at        timestamptz,
    operator_error      text,
    tenant_message      text,
    created_at          timestamptz     NOT NULL DEFAULT clock_timestamp(),
    CHECK (state <> 'claimed' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- At most one waiting and at most one claimed operation per resource.
CREATE UNIQUE INDEX operation_one_waiting_idx ON operation (resource_type, resource_id)
    WHERE state = 'waiting';
CREATE UNIQUE INDEX operation_one_claimed_idx ON operation (resource_type, resource_id)
    WHERE state = 'claimed';
-- The claim query walks this index only: finished rows never enter it.
CREATE INDEX operation_claim_idx ON operation (engine_instance_id, run_after, id)
    WHERE state = 'waiting';
CREATE INDEX operation_lease_idx ON operation (engine_instance_id, lease_expires_at)
    WHERE state = 'claimed';
CREATE INDEX operation_prune_idx ON operation (completed_at)
    WHERE state IN ('completed', 'superseded');
CREATE INDEX operation_failed_idx ON operation (engine_instance_id, completed_at)
    WHERE state = 'failed';

CREATE FUNCTION operation_signal() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM signal_raise('operations', NEW.engine_instance_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER operation_signal_insert AFTER INSERT ON operation
    FOR EACH ROW WHEN (NEW.state = 'waiting') EXECUTE FUNCTION operation_signal();
CREATE TRIGGER operation_signal_update AFTER UPDATE OF state, run_after ON operation
    FOR EACH ROW WHEN (NEW.state = 'waiting' AND NEW.run_after <= now())
    EXECUTE FUNCTION operation_signal();
