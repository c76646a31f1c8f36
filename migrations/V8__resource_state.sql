-- What the agent last made of a managed environment or a repository credential:
-- the generation of the row it last applied as an Argo CD Secret, the
-- tenant-readable message of the last reconcile that failed (cleared by the next
-- success), whether that failure is permanent, and the generation it failed at.
-- The same as application_state's agent columns, so every kind's failures reach
-- its tenant resource: changes are stamped from the same sequence and transaction
-- id and raise the same `status` signal, and the writers read these rows on the
-- same cursor as application_state.
-- Exactly one of the two ids is set; a row goes with the intent row it speaks of.

CREATE TABLE resource_state (
    managed_environment_id   bigint      UNIQUE REFERENCES managed_environment (id) ON DELETE CASCADE,
    repository_credential_id bigint      UNIQUE REFERENCES repository_credential (id) ON DELETE CASCADE,
    tenant_id                bigint      NOT NULL REFERENCES tenant (id),
    applied_generation       bigint,
    agent_message            text,
    agent_stalled            boolean     NOT NULL DEFAULT false,
    stalled_generation       bigint,
    seq                      bigint      NOT NULL DEFAULT nextval('application_state_seq'),
    changed_xid              xid8        NOT NULL DEFAULT pg_current_xact_id(),
    updated_at               timestamptz NOT NULL DEFAULT now(),
    CHECK (num_nonnulls(managed_environment_id, repository_credential_id) = 1)
);
CREATE INDEX resource_state_changed_xid_idx ON resource_state (changed_xid);

CREATE TRIGGER resource_state_stamp BEFORE UPDATE ON resource_state
    FOR EACH ROW EXECUTE FUNCTION application_state_stamp();

CREATE TRIGGER resource_state_signal AFTER INSERT OR UPDATE ON resource_state
    FOR EACH STATEMENT EXECUTE FUNCTION application_state_signal();
