-- Moving a tenant from one engine instance to another, without a gap or an overlap.
-- The move's transaction sets engine_instance_id to the target and remembers the
-- source in moving_from, with move_state 'releasing': the source's agent removes
-- the tenant's Argo CD objects there without pruning what they deployed, then
-- confirms in one transaction that sets 'adopting' and hands the target a tenant
-- operation; the target's agent applies the tenant's project and every row, and the
-- move ends (both columns NULL). move_reason says why (operator, drain, ...).

ALTER TABLE tenant
    ADD COLUMN moving_from     bigint REFERENCES engine_instance (id),
    ADD COLUMN move_state      text CHECK (move_state IN ('releasing', 'adopting')),
    ADD COLUMN move_started_at timestamptz,
    ADD COLUMN move_reason     text,
    ADD CONSTRAINT tenant_move_check CHECK ((move_state IS NULL) = (moving_from IS NULL));

-- While a tenant is being released, its ordinary operations wait parked
-- (run_after = infinity) whoever enqueues them: nothing of the tenant is applied on
-- the target before the source has let go. The confirmation brings them forward.
-- Its tenant operations (the release and the adoption themselves) are never parked.
CREATE FUNCTION operation_park_while_releasing() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.run_after < 'infinity'
       AND EXISTS (SELECT 1 FROM tenant t WHERE t.id = NEW.tenant_id AND t.move_state = 'releasing') THEN
        NEW.run_after := 'infinity';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER operation_park_insert BEFORE INSERT ON operation
    FOR EACH ROW WHEN (NEW.state = 'waiting' AND NEW.resource_type <> 'tenant')
    EXECUTE FUNCTION operation_park_while_releasing();

CREATE TRIGGER operation_park_update BEFORE UPDATE OF state, run_after, engine_instance_id ON operation
    FOR EACH ROW WHEN (NEW.state = 'waiting' AND NEW.resource_type <> 'tenant')
    EXECUTE FUNCTION operation_park_while_releasing();
