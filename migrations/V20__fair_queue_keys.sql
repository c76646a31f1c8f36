-- The claim order becomes a fair one, and the claim stops walking dead index entries.
--
-- Every due waiting operation carries a queue key. Claimers take the lowest keys of
-- their instance; each instance has a front, the highest key claimed so far, kept in
-- a sequence of its own (`operation_front_<instance id>`): sequences are not
-- versioned, so reading and advancing the front leaves no dead rows behind, whoever
-- holds the xmin horizon. An operation that becomes due gets the key
-- max(front, its tenant's last key on the instance + 1): a tenant with 5,000 waiting
-- operations holds keys front … front + 4,999, and a quiet tenant's operation lands at
-- the front, ahead of them (start-time fair queueing with one slot per tenant and round).
--
-- Keys rise as claims proceed, so everything below a claimer's floor is claimed or
-- finished: its dead index entries, which a held snapshot keeps from being cleaned up,
-- are skipped by starting the index scan at the floor (see shared/src/queue/floor.rs
-- for how the floor is kept safe). Operations that are not due (a retry's backoff, a
-- tenant being released) have no key and stay out of the claim's index; they get one
-- when they come due.

ALTER TABLE operation ADD COLUMN queue_key bigint;

-- The front of an instance; 0 while nothing was claimed (or the sequence is missing).
CREATE FUNCTION operation_front(p_instance bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN COALESCE(pg_sequence_last_value(to_regclass('operation_front_' || p_instance)), 0);

-- Moves the front forward (never back, short of two claimers racing, which costs
-- fairness a batch at most and never correctness).
CREATE FUNCTION operation_advance_front(p_instance bigint, p_key bigint) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    v_sequence regclass := to_regclass('operation_front_' || p_instance);
BEGIN
    IF v_sequence IS NOT NULL AND p_key > COALESCE(pg_sequence_last_value(v_sequence), 0) THEN
        PERFORM setval(v_sequence, p_key);
    END IF;
END;
$$;

CREATE FUNCTION engine_instance_front() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 0 START 0',
                       'operation_front_' || NEW.id);
    ELSE
        EXECUTE format('DROP SEQUENCE IF EXISTS %I', 'operation_front_' || OLD.id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER engine_instance_front AFTER INSERT OR DELETE ON engine_instance
    FOR EACH ROW EXECUTE FUNCTION engine_instance_front();

DO $$
DECLARE
    v_id bigint;
BEGIN
    FOR v_id IN SELECT id FROM engine_instance LOOP
        EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 0 START 0',
                       'operation_front_' || v_id);
    END LOOP;
END;
$$;

-- Gives a waiting operation that is due its key, and takes it from one that is not.
-- One that keeps waiting due on the same instance keeps its place. Runs after the
-- parking triggers (triggers fire in name order), so a parked operation has no key.
-- Rows leaving `waiting` keep theirs: it is out of the claim's index with them.
CREATE FUNCTION operation_assign_queue_key() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    v_front bigint;
    v_last  bigint;
BEGIN
    IF NEW.run_after > clock_timestamp() THEN
        NEW.queue_key := NULL;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'waiting' AND OLD.queue_key IS NOT NULL
       AND OLD.engine_instance_id = NEW.engine_instance_id THEN
        NEW.queue_key := OLD.queue_key;
        RETURN NEW;
    END IF;
    v_front := operation_front(NEW.engine_instance_id);
    -- The tenant's highest key, read from the top of its range of
    -- operation_tenant_key_idx (one entry, however long its backlog); only keys at or
    -- past the front, so that the scan never reaches claimed history.
    SELECT o.queue_key INTO v_last
      FROM operation o
     WHERE o.engine_instance_id = NEW.engine_instance_id
       AND o.tenant_id = NEW.tenant_id
       AND o.state = 'waiting' AND o.queue_key IS NOT NULL
       AND o.queue_key >= v_front
     ORDER BY o.queue_key DESC
     LIMIT 1;
    NEW.queue_key := GREATEST(v_front, v_last + 1);
    RETURN NEW;
END;
$$;

CREATE TRIGGER operation_queue_key_insert BEFORE INSERT ON operation
    FOR EACH ROW WHEN (NEW.state = 'waiting') EXECUTE FUNCTION operation_assign_queue_key();
CREATE TRIGGER operation_queue_key_update BEFORE UPDATE OF state, run_after, engine_instance_id ON operation
    FOR EACH ROW WHEN (NEW.state = 'waiting') EXECUTE FUNCTION operation_assign_queue_key();

-- Every operation already due gets its key (fires the trigger above).
UPDATE operation SET run_after = run_after WHERE state = 'waiting' AND run_after <= now();

DROP INDEX operation_claim_idx;
-- The claim reads this index from its floor on.
CREATE INDEX operation_claim_idx ON operation (engine_instance_id, queue_key, id)
    WHERE state = 'waiting' AND queue_key IS NOT NULL;
-- A tenant's last key, for the next key the tenant gets.
CREATE INDEX operation_tenant_key_idx ON operation (engine_instance_id, tenant_id, queue_key)
    WHERE state = 'waiting' AND queue_key IS NOT NULL;
-- The claim asks whether a resource has a claimed operation by probing
-- operation_one_claimed_idx; the lease index, whose predicate was the same, could
-- be picked instead and read whole (with every entry that claims left behind). Its
-- predicate now names the lease, which the lease queries' conditions imply and the
-- claimed-resource check's do not.
DROP INDEX operation_lease_idx;
CREATE INDEX operation_lease_idx ON operation (engine_instance_id, lease_expires_at)
    WHERE state = 'claimed' AND lease_expires_at IS NOT NULL;
-- Operations waiting for their time (backoff, parked): what comes due next.
CREATE INDEX operation_delayed_idx ON operation (engine_instance_id, run_after)
    WHERE state = 'waiting' AND queue_key IS NULL;

-- The signal's shared advisory lock is now taken at every isolation level: a
-- claimer that holds it exclusively knows that no operation is being written for the
-- instance (queue floors rely on it), not only that nobody needs waking.
CREATE OR REPLACE FUNCTION signal_raise(p_kind signal_kind, p_ref bigint) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    v_sleeping boolean;
BEGIN
    -- Benchmark-only switch: measures the enqueue path without its signalling step.
    IF current_setting('gitops.bench_skip_signal', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(signal_lock_key(p_kind, p_ref));
    -- Above READ COMMITTED the read below would use the transaction's first
    -- snapshot; notifying unconditionally keeps the guarantee there.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(signal_channel(p_kind, p_ref), '');
        RETURN;
    END IF;
    SELECT s.sleeping INTO v_sleeping FROM signal s WHERE s.kind = p_kind AND s.ref_id = p_ref;
    IF v_sleeping IS DISTINCT FROM false THEN
        PERFORM pg_notify(signal_channel(p_kind, p_ref), '');
    END IF;
END;
$$;
