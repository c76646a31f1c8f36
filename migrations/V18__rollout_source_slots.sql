-- A rollout holds, on each source instance, the slot of every tenant it moved
-- away, until the rollout ends: a rollback must always find room to bring its
-- tenants home, even after new tenants arrived on the source meanwhile.
--
-- rollout_tenant.slot_held: the tenant's slot on its source is held for it. It is
-- set when the tenant joins the rollout, and cleared when the tenant is placed on
-- its source again (the trigger below: it takes the held slot, whatever the
-- source's room) or the rollout stops acting on it (active = false).
-- engine_instance.reserved: the slots held on the instance; kept by a trigger on
-- rollout_tenant. Placement and moves count them as taken: an instance has room
-- while tenants + reserved < capacity.
--
-- A rollout's target takes no other new tenants. The statement that starts a
-- rollout locks the target's row first, and the placement trigger, which updates
-- that row (waiting for the lock) before it checks, refuses (as a serialization
-- failure, so the placing transaction runs again and chooses elsewhere) a tenant
-- arriving on an active rollout's target other than by the rollout's own moves
-- (move_reason 'rollout', or 'rollback' returning to a source).

ALTER TABLE engine_instance
    ADD COLUMN reserved integer NOT NULL DEFAULT 0 CHECK (reserved >= 0);

ALTER TABLE rollout_tenant
    ADD COLUMN slot_held boolean NOT NULL DEFAULT true;

-- Rollouts active when this migration runs hold their tenants' slots from now on.
UPDATE rollout_tenant SET slot_held = active AND state <> 'returned';
UPDATE engine_instance e
   SET reserved = (SELECT count(*) FROM rollout_tenant rt
                    WHERE rt.source_instance_id = e.id AND rt.active AND rt.slot_held);

CREATE INDEX rollout_tenant_held_slot ON rollout_tenant (tenant_id, source_instance_id) WHERE active AND slot_held;

CREATE FUNCTION rollout_tenant_slot_count() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    held_before boolean := TG_OP IN ('UPDATE', 'DELETE') AND OLD.active AND OLD.slot_held;
    held_after  boolean := TG_OP IN ('INSERT', 'UPDATE') AND NEW.active AND NEW.slot_held;
BEGIN
    IF held_before AND (NOT held_after OR OLD.source_instance_id <> NEW.source_instance_id) THEN
        UPDATE engine_instance SET reserved = reserved - 1 WHERE id = OLD.source_instance_id;
    END IF;
    IF held_after AND (NOT held_before OR OLD.source_instance_id <> NEW.source_instance_id) THEN
        UPDATE engine_instance SET reserved = reserved + 1 WHERE id = NEW.source_instance_id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER rollout_tenant_slot_count AFTER INSERT OR DELETE OR UPDATE OF active, slot_held, source_instance_id
    ON rollout_tenant FOR EACH ROW EXECUTE FUNCTION rollout_tenant_slot_count();

CREATE OR REPLACE FUNCTION tenant_placement_count() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.engine_instance_id IS NOT NULL
       AND (TG_OP = 'DELETE' OR OLD.engine_instance_id IS DISTINCT FROM NEW.engine_instance_id) THEN
        UPDATE engine_instance SET tenants = tenants - 1 WHERE id = OLD.engine_instance_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.engine_instance_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR OLD.engine_instance_id IS DISTINCT FROM NEW.engine_instance_id) THEN
        -- Back on a source that held its slot: the slot becomes the tenant's.
        UPDATE rollout_tenant SET slot_held = false
         WHERE tenant_id = NEW.id AND source_instance_id = NEW.engine_instance_id AND active AND slot_held;
        IF FOUND THEN
            UPDATE engine_instance SET tenants = tenants + 1 WHERE id = NEW.engine_instance_id;
        ELSE
            UPDATE engine_instance SET tenants = tenants + 1
             WHERE id = NEW.engine_instance_id AND tenants + reserved < capacity;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'engine instance % is full', NEW.engine_instance_id
                    USING ERRCODE = 'serialization_failure', CONSTRAINT = 'engine_instance_capacity';
            END IF;
        END IF;
        -- The instance's row is locked now: a rollout started meanwhile is seen.
        IF COALESCE(NEW.move_reason, '') NOT IN ('rollout', 'rollback')
           AND EXISTS (SELECT 1 FROM rollout r WHERE r.target_instance_id = NEW.engine_instance_id
                          AND r.state IN ('moving', 'baking', 'waiting', 'rolling_back')) THEN
            RAISE EXCEPTION 'engine instance % is the target of a rollout and takes no other tenants',
                NEW.engine_instance_id
                USING ERRCODE = 'serialization_failure', CONSTRAINT = 'engine_instance_rollout_target';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
