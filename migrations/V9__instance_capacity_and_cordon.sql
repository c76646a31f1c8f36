-- Capacity becomes a hard limit, enforced here: engine_instance.tenants counts the
-- tenants placed on each instance (kept by a trigger on tenant), and a placement
-- that would pass the capacity fails ("engine instance N is full"). The increment
-- locks the instance's row, so placements racing for its last slot are serialised
-- and the later one fails. It fails as a serialization failure (40001), because
-- that is what it is: the writer's retry runs the transaction again and its
-- placement then sees the instance full and chooses another.
-- An instance already above its capacity keeps its tenants; it takes no more.
-- cordoned: an operator's "no new tenants here" (placement skips it).

ALTER TABLE engine_instance
    ADD COLUMN tenants  integer NOT NULL DEFAULT 0,
    ADD COLUMN cordoned boolean NOT NULL DEFAULT false;

UPDATE engine_instance e
   SET tenants = (SELECT count(*) FROM tenant t WHERE t.engine_instance_id = e.id);

CREATE FUNCTION tenant_placement_count() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.engine_instance_id IS NOT NULL
       AND (TG_OP = 'DELETE' OR OLD.engine_instance_id IS DISTINCT FROM NEW.engine_instance_id) THEN
        UPDATE engine_instance SET tenants = tenants - 1 WHERE id = OLD.engine_instance_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.engine_instance_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR OLD.engine_instance_id IS DISTINCT FROM NEW.engine_instance_id) THEN
        UPDATE engine_instance SET tenants = tenants + 1
         WHERE id = NEW.engine_instance_id AND tenants < capacity;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'engine instance % is full', NEW.engine_instance_id
                USING ERRCODE = 'serialization_failure', CONSTRAINT = 'engine_instance_capacity';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER tenant_placement_count AFTER INSERT OR DELETE OR UPDATE OF engine_instance_id ON tenant
    FOR EACH ROW EXECUTE FUNCTION tenant_placement_count();
