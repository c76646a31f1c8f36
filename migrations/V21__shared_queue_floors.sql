-- The queue's floors are kept by the database, for every agent of an instance, and the
-- lease upkeep gets one of its own.
--
-- While a snapshot is held, no dead index entry can be cleaned up, and a scan that
-- starts at the bottom of an index visits every entry left since the snapshot. Until
-- now each consumer kept its safe claim floor in memory, so a consumer that started
-- scanned the claim index from the start, and the lease upkeep (expired leases, the
-- next expiry) read operation_lease_idx from its lowest expiry, past the entry of every
-- lease taken since the snapshot, every round. Both now start at a floor kept in a
-- sequence per instance (sequences are not versioned: moving a floor leaves no dead
-- row, whoever holds the xmin horizon):
--
-- - `operation_floor_<instance id>`: the highest safe claim floor found by any of the
--   instance's consumers. A safe floor is a lower bound of every waiting key from the
--   moment it was found on (shared/src/queue/floor.rs), so the highest one found is.
-- - `operation_lease_floor_<instance id>`: a lower bound of the queue key of every
--   claimed operation. Claimed operations are found by key (a claim takes its key
--   with it) instead of by lease expiry: the bound is the lower of the lowest claimed
--   key and the claim floor read *before* the lowest claimed key was looked for
--   (whatever is claimed later was waiting then, at or above it). The upkeep reads
--   the claimed operations from there: a few, plus what was claimed since the oldest
--   of them, not everything since the snapshot.

-- A floor of an instance (`kind` is 'floor' or 'lease_floor'); 0, the lowest key, while
-- none was found (or the sequence is missing).
CREATE FUNCTION operation_mark(p_kind text, p_instance bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN COALESCE(pg_sequence_last_value(to_regclass('operation_' || p_kind || '_' || p_instance)), 0);

-- Raises a floor of an instance to `p_value` (never lowers it); returns the floor.
CREATE FUNCTION operation_advance_mark(p_kind text, p_instance bigint, p_value bigint) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_sequence regclass := to_regclass('operation_' || p_kind || '_' || p_instance);
    v_current  bigint;
BEGIN
    IF v_sequence IS NULL THEN
        RETURN 0;
    END IF;
    v_current := COALESCE(pg_sequence_last_value(v_sequence), 0);
    IF p_value > v_current THEN
        PERFORM setval(v_sequence, p_value);
        RETURN p_value;
    END IF;
    RETURN v_current;
END;
$$;

CREATE OR REPLACE FUNCTION engine_instance_front() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    v_kind text;
BEGIN
    FOREACH v_kind IN ARRAY ARRAY['front', 'floor', 'lease_floor'] LOOP
        IF TG_OP = 'INSERT' THEN
            EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 0 START 0',
                           'operation_' || v_kind || '_' || NEW.id);
        ELSE
            EXECUTE format('DROP SEQUENCE IF EXISTS %I', 'operation_' || v_kind || '_' || OLD.id);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

DO $$
DECLARE
    v_id   bigint;
    v_kind text;
BEGIN
    FOR v_id IN SELECT id FROM engine_instance LOOP
        FOREACH v_kind IN ARRAY ARRAY['floor', 'lease_floor'] LOOP
            EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 0 START 0',
                           'operation_' || v_kind || '_' || v_id);
        END LOOP;
    END LOOP;
END;
$$;

-- Every claimed operation has a key: the claim takes only keyed ones, and one made
-- claimed some other way (by hand, or claimed before keys existed) gets its instance's
-- front, which no floor passes.
CREATE FUNCTION operation_claimed_key() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    NEW.queue_key := operation_front(NEW.engine_instance_id);
    RETURN NEW;
END;
$$;

CREATE TRIGGER operation_claimed_key BEFORE INSERT OR UPDATE ON operation
    FOR EACH ROW WHEN (NEW.state = 'claimed' AND NEW.queue_key IS NULL)
    EXECUTE FUNCTION operation_claimed_key();

UPDATE operation SET queue_key = 0 WHERE state = 'claimed' AND queue_key IS NULL;

-- The upkeep finds claimed operations by key from the lease floor. The predicate names
-- the key, which the upkeep's `queue_key >= floor` implies and the claim's
-- claimed-resource check does not: with the same predicate as
-- operation_one_claimed_idx, this index could be picked for that check and read whole.
DROP INDEX operation_lease_idx;
CREATE INDEX operation_claimed_key_idx ON operation (engine_instance_id, queue_key)
    WHERE state = 'claimed' AND queue_key IS NOT NULL;
